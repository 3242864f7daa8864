"""The benchmark scripts whose `--smoke` starts Prefect, Ray or a `unirl` command (round_overhead's train flow,
refactor_equivalence's `unirl train`, ingest's `unirl ingest`), in a file of their own so that the other test
worker takes the rest (test_benchmark_smoke.py)."""

from __future__ import annotations

import pytest
from benchmark_smoke import SERVICES, run_smoke

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("script", SERVICES)
def test_the_smoke_run_prints_the_table(script, tmp_path):
    run_smoke(script, tmp_path)
