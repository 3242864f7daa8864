"""`benchmarks/ar_grpo.py --smoke`: one GRPO step of the autoregressive domain and of TRL's GRPOTrainer on the tiny
Qwen3, side by side, runs to its table (the figures themselves are the benchmark's to judge, not this test's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROWS = ("generated tokens/s (whole step)", "generated tokens/s (generation)", "GRPO step (s)", "  generation (s)",
        "  old/ref log-probs (s)", "  reward + advantages (s)", "  update (s)", "no-grad log-prob pass (s, outside)",
        "generated tokens per step", "mean completion length")  # fmt: skip


def test_the_smoke_run_prints_the_unirl_vs_trl_table(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "UNIRL_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "benchmarks/ar_grpo.py", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("metric"))
    assert lines[header].split() == ["metric", "unirl", "TRL", "ratio"]
    table = dict(zip(ROWS, lines[header + 1 : header + 1 + len(ROWS)], strict=True))
    for label, line in table.items():
        assert line.startswith(label), (label, line)
        unirl, trl, ratio = line[len(label) :].split()
        assert float(unirl) >= 0 and float(trl) >= 0
        assert ratio == "-" or re.fullmatch(r"\d+\.\d\dx", ratio), line
    for label in ("generated tokens/s (whole step)", "GRPO step (s)", "  generation (s)", "  update (s)"):
        assert table[label].split()[-1] != "-" and all(float(x) > 0 for x in table[label][len(label) :].split()[:2])
    tokens = table["generated tokens per step"][len("generated tokens per step") :].split()
    assert 0 < float(tokens[0]) <= 2 * 4 * 8 and 0 < float(tokens[1]) <= 2 * 4 * 8  # 2 prompts x 4, 8 tokens at most
    assert "unirl step 1:" in done.stdout and "TRL step 1:" in done.stdout  # the counted step of each side
