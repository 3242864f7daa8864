"""A real SIGKILL of `unirl train RECIPE --local` once its first checkpoint is committed, then the same command
again: what a user's kill -9 (or a lost node) and re-run do. Returns the metric rows of the rerun's output folder,
the last row of each step (steps run twice log twice)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from local_training import comparable


def killed_then_rerun(recipe: str, sets: list[str], output_dir: Path, steps: int = 4) -> list[dict]:
    """Run `unirl train recipe --local` (`steps` steps, a checkpoint every 2), SIGKILL its process group once step 1
    is committed, run it again to the end; the comparable rows of steps 0 .. steps-1."""
    command = [str(Path(sys.executable).parent / "unirl"), "train", recipe, "--local", "--steps", str(steps),
               "--checkpoint-every", "2", *[f"--set={o}" for o in [*sets, f"train.output_dir={output_dir}"]]]  # fmt: skip
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    marker, deadline = output_dir / "checkpoints/step_00000001/trainer_state.json", time.monotonic() + 300
    while not marker.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, process.stdout.read().decode()[-3000:]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (output_dir / f"checkpoints/step_{steps - 1:08d}").exists()  # killed before the end
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    last = {row["step"]: row for row in comparable(rows)}
    return [last[step] for step in range(steps)]
