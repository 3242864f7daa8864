"""Issue 35's lean imports: the paths a bare GPU node runs (torch, transformers, peft, accelerate, safetensors and
the wheelhouse; no Ray, no Prefect) import neither, and optional heavy libraries load in the factory that needs
them. Each command runs with those packages made unimportable (`tests/support/blocked_imports.py`): it fails here
the day one of them comes back to the path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = "ray,prefect"


def without(names: str, *command: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "UNIRL_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"}
    script = str(ROOT / "tests" / "support" / "blocked_imports.py")
    return subprocess.run([sys.executable, script, names, *command], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_unirl_train_local_needs_neither_ray_nor_prefect(tmp_path):
    done = without(BLOCKED, "-m", "flows.cli", "train", "demo", "--local", "--steps", "1", home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "registered model: unirl-demo version 1" in done.stdout  # checkpoint, export and MLflow ran too


def test_unirl_plan_needs_neither_ray_nor_prefect(tmp_path):
    done = without(BLOCKED, "-m", "flows.cli", "plan", "demo", "--variant", "sd3.5-medium", home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "largest term" in done.stdout


def test_the_gpu_tests_and_benchmarks_load_without_ray_prefect_or_rapidfuzz(tmp_path):
    blocked = f"{BLOCKED},rapidfuzz"
    collected = without(blocked, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                        home=tmp_path)  # fmt: skip
    assert collected.returncode == 0, collected.stdout[-3000:]  # 2 on a collection error
    benchmark = without(blocked, "benchmarks/rl_throughput.py", "--help", home=tmp_path)
    assert benchmark.returncode == 0, benchmark.stderr[-3000:]


def test_the_blocker_blocks():
    """The checks above can fail: with the blocker, `import ray` fails as on a machine without it."""
    probe = ROOT / "tests" / "support" / "blocked_imports.py"
    done = subprocess.run([sys.executable, str(probe), "ray", "-m", "ray"], capture_output=True, text=True)
    assert done.returncode != 0 and "No module named 'ray' (blocked" in done.stderr
