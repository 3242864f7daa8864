"""Every benchmark script runs end to end in its `--smoke` mode (tiny shapes, one repeat) and prints its table: both
sides of its comparison and the ratio, so none can rot unnoticed (issue 36: `round_overhead.py` crashed on a
changed return type because nothing ran it). The figures themselves are the benchmarks' to judge, not this test's.
A new benchmark without `--smoke`, or without its table's lines in tests/support/benchmark_smoke.py, fails here;
those that start Prefect or a `unirl` command: test_benchmark_smoke_services.py."""

from __future__ import annotations

import pytest
from benchmark_smoke import BENCHMARKS, MODULES, SCRIPTS, SERVICES, run_smoke

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in SERVICES])
def test_the_smoke_run_prints_the_table(script, tmp_path):
    run_smoke(script, tmp_path)


def test_the_modules_left_out_are_imported_not_run():
    """MODULES have no command line to smoke: no `__main__` block, and a script imports each."""
    sources = [(BENCHMARKS / script).read_text() for script in SCRIPTS]
    for module in MODULES:
        assert '__name__ == "__main__"' not in (BENCHMARKS / module).read_text(), f"{module} is a script: smoke it"
        assert any(f"import {module.removesuffix('.py')}" in s or f"from {module.removesuffix('.py')} " in s
                   for s in sources), f"no benchmark imports {module}"  # fmt: skip
