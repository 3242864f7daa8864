"""Golden per-step metrics: a fixed-seed run's metrics at each step, recorded on the 2-core CPU machine this project
tests on and compared with a float tolerance: another CPU's kernels may sum in another order, and a pixel channel
that rounds the other way moves a JPEG by a byte (with jpeg_compressibility a run on 1 thread differed from one on 2
by 2% in step 1's reward std and 13% in step 3's gradient norm), so golden runs are rewarded with `brightness`, which
a one-channel flip moves by at most ~1e-5 (the same runs: equal to the last bit).

After a deliberate numeric change, record them again and commit the JSON with the change, naming it in the note:

    UNIRL_RECORD_GOLDENS=1 .venv/bin/python -m pytest tests/integration/test_families.py
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

GOLDENS = Path(__file__).resolve().parents[1] / "goldens"
REWARD = "train.reward.weights={brightness: 1.0}"  # a golden run's reward (see above)
CHECKED = ("reward_mean", "reward_std", "advantage_abs_max", "ratio_mean", "approx_kl", "loss", "grad_norm", "lr")
RTOL = 1e-2
ATOL = 1e-6


def check_golden(table: str, key: str, rows: list[dict], steps: int | None = None) -> None:
    """`rows`' CHECKED metrics equal the golden `key` of `GOLDENS/<table>.json` within RTOL/ATOL, at the first
    `steps` steps (all by default: a run whose trajectory parts between CPUs checks the steps before it does); with
    UNIRL_RECORD_GOLDENS=1, record them all instead (the test is then skipped, saying so)."""
    path = GOLDENS / f"{table}.json"
    goldens = json.loads(path.read_text()) if path.is_file() else {}
    got = [{name: row[name] for name in CHECKED if name in row} for row in rows]
    if os.environ.get("UNIRL_RECORD_GOLDENS"):
        goldens[key] = got
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(_one_step_a_line(goldens))
        temporary.replace(path)
        pytest.skip(f"recorded {len(got)} steps of {key} in {path}")
    assert key in goldens, (
        f"{path} has no {key!r}: record it with UNIRL_RECORD_GOLDENS=1 (see tests/support/goldens.py)"
    )
    expected = goldens[key]
    assert len(got) == len(expected), f"{key}: {len(got)} steps, the golden has {len(expected)}"
    for step, (row, golden) in enumerate(zip(got[:steps], expected[:steps], strict=True)):
        assert row.keys() == golden.keys(), f"{key} step {step}: metrics {sorted(row)} vs golden {sorted(golden)}"
        for name, value in golden.items():
            assert math.isclose(row[name], value, rel_tol=RTOL, abs_tol=ATOL), (
                f"{key} step {step}: {name} {row[name]!r}, golden {value!r} (rtol {RTOL}); a deliberate change "
                "records them again (see tests/support/goldens.py)"
            )


def _one_step_a_line(goldens: dict[str, list[dict]]) -> str:
    runs = [f" {json.dumps(key)}: [\n" + ",\n".join(f"  {json.dumps(step, sort_keys=True)}" for step in steps) + "\n ]"
            for key, steps in sorted(goldens.items())]  # fmt: skip
    return "{\n" + ",\n".join(runs) + "\n}\n"
