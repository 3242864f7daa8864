"""`make gpu-check` on a machine without CUDA (this one, and CI): every check is skipped with its reason, the
reports are written, the exit code is 0; a name it does not know is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the checks would run")
def test_without_cuda_every_check_is_skipped_with_its_reason_and_it_exits_0(tmp_path):
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device"] is None
    assert [c["name"] for c in report["checks"]] == [
        "gpu_tests",
        "local_resume",
        "deterministic",
        "sd35_step",
        "flux_step",
    ]
    assert all(c["status"] == "skip" and "no CUDA device" in c["reason"] for c in report["checks"])
    assert "| sd35_step | skip |" in (tmp_path / "gpu_check.md").read_text()


def test_an_unknown_check_name_is_refused():
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--only", "gpu_tests,nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and "--only nope" in done.stderr
