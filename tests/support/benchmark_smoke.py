"""What tests/integration/test_benchmark_smoke*.py check of each benchmark script's `--smoke` run: the lines its
table must print (TABLES), how it is run (`run_smoke`). The scripts are every `benchmarks/*.py` but the modules they
import (MODULES); SERVICES, those that start Prefect or a `unirl` command, run in a file of their own so that the
two test workers share the time (`--dist loadfile`)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
MODULES = {"bare_loop.py": "the bare RL steps that rl_step.py and round_overhead.py time"}  # imported, not run
SCRIPTS = sorted(path.name for path in BENCHMARKS.glob("*.py") if path.name not in MODULES)
SERVICES = ("ingest_vs_img2dataset.py", "refactor_equivalence.py", "round_overhead.py")  # start Prefect or unirl

N = r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?"  # a printed figure
X = r"\d+\.\d\dx"  # a ratio
ALGORITHMS = ("grpo", "mixgrpo_flash", "dancegrpo", "diffusion_nft")  # algorithms.py's SMOKE_RUNS
AR_GRPO_ROWS = {  # ar_grpo.py's rows: label -> its ratio (unirl vs TRL), or "-" for the information rows
    "generated tokens/s (whole step)": X, "generated tokens/s (generation)": X, "GRPO step (s)": X,
    "  generation (s)": X, "  old/ref log-probs (s)": rf"(?:{X}|-)", "  reward + advantages (s)": rf"(?:{X}|-)",
    "  update (s)": X, "no-grad log-prob pass (s, outside)": X, "generated tokens per step": "-",
    "mean completion length": "-",
}  # fmt: skip
TABLES = {  # script -> lines (regular expressions) its smoke run must print: the table's rows, the ratio
    "algorithms.py": [
        r"^recipes load: \d+ algorithms \(grpo, ",  # every algorithm's overrides still valid
        r"^algorithm\s+gain per seed\s+mean gain\s+final\s+s/step\s+train s\s+vs grpo$",
        *(rf"^{name}\s+[+-]\d\.\d{{3}}\s+[+-]\d\.\d{{3}}\s+{N}\s+{N}\s+{N}\s+{X}$" for name in ALGORITHMS),
        r"^grpo\s.*\s1\.00x$",
    ],
    "ar_grpo.py": [
        r"^metric\s+unirl\s+TRL\s+ratio$",
        *(rf"^{re.escape(label)}\s+{N}\s+{N}\s+{ratio}$" for label, ratio in AR_GRPO_ROWS.items()),
        r"^  unirl step 1: ",  # the counted step of each side
        r"^  TRL step 1: ",
    ],
    "bagel_packing.py": [
        rf"^bare iteration\s+{N} samples/s",
        rf"^packed\s+{N} samples/s",
        rf"^packed / bare\s+{N}$",
        rf"^fill ratio\s+mean {N}, min {N}, max {N}",
    ],
    "bagel_vlm_index.py": [
        rf"^readlines \(BAGEL\)\s+build\s+{N} s\s+\+private\s+{N} MB$",
        *(
            rf"^ours, target {t}\s+build\s+{N} s\s+\+private\s+{N} MB\s+state\(\) {N} ms\s+memory / readlines (?:{N}|-)$"
            for t in ("unirl", "bagel")
        ),
    ],  # fmt: skip
    "checkpoint_checksum.py": [
        r"^step\s+seconds\s+GB/s\s+x save$",
        rf"^dcp\.save\s+{N}\s+{N}\s+1\.00$",
        *(rf"^{name}\s+{N}\s+{N}\s+{N}$" for name in ("commit: file_digests", "resume: verify_files", "dcp.load")),
    ],
    "eval_throughput.py": [
        r"^\s+seconds\s+images/s$",
        rf"^unirl eval\s+{N}\s+{N}$",
        rf"^bare pipeline\s+{N}\s+{N}$",
        rf"^unirl eval images/s vs the bare pipeline's: {X}",
    ],
    "ingest_vs_img2dataset.py": [
        rf"^bare loop\s+{N} images/s",
        rf"^unirl ingest\s+{N} images/s .*, 4 ok\)$",  # every image ingested
        rf"^(?:ratio unirl / img2dataset\s+{N}|img2dataset 1\.47\s+skipped: the img2dataset package is not installed)",
        rf"^ratio unirl / bare loop\s+{N}",
    ],
    "precache_overhead.py": [
        rf"^bare encoder loop\s+{N} samples/s",
        rf"^full precache\s+{N} samples/s",
        rf"^ratio precache / bare\s+{N}",
    ],
    "prompt_loading.py": [
        rf"^bare json\.loads\s+{N} rows/s$",
        rf"^unirl load_prompts\s+{N} rows/s$",
        rf"^ratio bare/ours\s+{N} ",
    ],
    "refactor_equivalence.py": [  # one run recorded, then checked against the record read back
        r"^smoke: recorded 1 steps, [1-9]\d* adapter tensors$",
        r"^smoke: bitwise equal: 1 steps of metrics, [1-9]\d* adapter tensors$",
    ],
    "rl_step.py": [
        r"^model\s+params\s+px\s+s/step\s+img/s\s+rollout\s+reward\s+train$",
        *(rf"^{m}\s+{N}M\s+32\s+{N}\s+{N}\s+\d+%\s+\d+%\s+\d+%" for m in ("tiny-sd3", "tiny-sd15", "nano-sd3")),
    ],
    "rl_throughput.py": [
        r"^phase\s+s\s+share\s+img/s\s+peak RSS GiB",
        *(rf"^{phase}\s+{N}\s+\d+%\s+(?:{N}|-)\s+{N}$" for phase in ("rollout", "reward", "pi_old", "train")),
        rf"^GRPO step\s+{N}\s+100%\s+{N}\s+{N}$",
        rf"^bare pipeline\s+{N}\s+{N}\s+{N}$",
        rf"^rollout images/s vs the bare pipeline's: {X}",
    ],
    "round_overhead.py": [
        r"^mode\s+workers\s+threads\s+s/step\s+img/s\s+vs bare\s+rollout\s+train\s+startup s\s+finish s\s+wall s$",
        rf"^bare\s+1\s+1\s+{N}\s+{N}\s+1\.00x\s",
        rf"^bare-1t\s+1\s+1\s+{N}\s+{N}\s+{X}\s",
        rf"^ray-1\s+1\s+1\s+{N}\s+{N}\s+{X}\s",  # the Prefect train flow on a local Ray
        rf"^goal <= 1\.10x: (?:met|not met) for ray-1 \({X} at steady state",
    ],
    "video_rollout.py": [
        r"^\d+ videos of \d+x\d+, \d+ steps, CFG 4\.5, on cpu$",
        r"^frames\s+rollout s\s+pipeline s\s+s/step/video\s+ratio$",
        *(rf"^{frames}\s+{N}\s+{N}\s+{N}\s+{X}$" for frames in (5, 9)),
    ],
    "warmup_data_memory.py": [
        r"^4 samples, batch 2 \(latents \[2, ",
        rf"^private memory added\s+{N} MB$",
        rf"^first batch \(index\)\s+{N} s$",
        rf"^later batches\s+{N} ms per batch$",
    ],
    "warmup_precache_gain.py": [
        r"^mode\s+steps/s\s+s/step\s+median\s+encode or read$",
        rf"^on the fly\s+{N}\s+{N}\s+{N}\s+\d+%$",
        rf"^precached\s+{N}\s+{N}\s+{N}\s+\d+%$",
        r"^losses of the two modes agree to \d\.\de-(?:0[5-9]|[1-9]\d) ",  # the same batches and draws: < 1e-4
        rf"^ratio precached / on the fly\s+{X}",
    ],
}


def smoke_flag(script: str) -> bool:
    """Whether the script's argparse declares `--smoke`."""
    tree = ast.parse((BENCHMARKS / script).read_text())
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "add_argument" and node.args and isinstance(node.args[0], ast.Constant)
               and node.args[0].value == "--smoke" for node in ast.walk(tree))  # fmt: skip


def environment(home: Path) -> dict:
    """The documented commands' environment, a scratch workspace, and one torch thread: another test worker shares
    the cores, and OpenMP threads waiting for each other slow these tiny operations tens of times."""
    return {**os.environ, "UNIRL_HOME": str(home), "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
            "PREFECT_HOME": str(home / "prefect"), "HF_HUB_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true",
            "DO_NOT_TRACK": "1", "RAY_AUTH_MODE": "disabled", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def run_smoke(script: str, home: Path) -> None:
    """Run `benchmarks/<script> --smoke` in workspace `home`; assert it exits 0 and prints its TABLES lines."""
    assert smoke_flag(script), (
        f"benchmarks/{script} has no --smoke in its argparse: every benchmark needs a smoke mode (tiny shapes, one "
        "repeat, seconds) that runs its comparison end to end; make test runs it"
    )
    assert script in TABLES, f"benchmarks/{script}: add the lines its --smoke table prints to TABLES in {__file__}"
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--smoke"], cwd=ROOT, env=environment(home),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    missing = [line for line in TABLES[script] if not re.search(line, done.stdout, re.MULTILINE)]
    assert not missing, f"not printed: {missing}\n--- stdout:\n{done.stdout[-4000:]}"
