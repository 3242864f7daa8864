"""Round overhead: the same RL steps in one bare process (`bare_loop.bare_steps`: the computation alone) vs the Prefect
`train` flow running them as a round on a local Ray with 1 and 2 FSDP workers.

    .venv/bin/python benchmarks/round_overhead.py [--model mid-sd3] [--steps 5] [--skip 1] [--inference-steps 4]
                                                  [--px 64] [--cpus N] [--modes bare,bare-1t,ray-1,ray-2] [--repeat 3]
    .venv/bin/python benchmarks/round_overhead.py --smoke   # tiny-sd3, 2 steps, modes bare,bare-1t,ray-1 on 1 CPU

Every mode runs the `demo` recipe (2 prompts x 4 samples, LoRA rank 8, CFG off, jpeg_compressibility) on a model of
rl_step.py built from config with random weights (mid-sd3 by default: 4 layers x 256 wide, ~9 M parameters, 64 px,
4 denoising steps: several seconds per step on 2 CPU cores, so compute dominates), at learning rate 1e-4, with its
own fresh output_dir; the rounds track into one sqlite MLflow in a temporary folder and run under a temporary
Prefect API (created before the first round and not counted).

  bare      bare_steps in this process, torch threads = --cpus (all cores by default; the baseline of every ratio)
  bare-1t   the same with torch.set_num_threads(1): what one core does alone
  ray-1     the train flow, 1 worker with --cpus CPUs (torch threads = cpus_per_worker)
  ray-2     the train flow, 2 workers with --cpus / 2 CPUs each (each rank rolls out and trains half the groups)

A step's time is the wall time between the ends of consecutive steps (the runner yielding a row, or the controller
logging one: scatter, gather, advantages, metrics.jsonl and MLflow included); the first --skip steps are warm-up.
startup = wall time to the first step's start (flow and task start, MLflow run and params, Ray start, workers
building and sharding the model; model loading for the bare runner); finish = wall time after the last step's end
(checkpoint, sample grid, Ray teardown, export and model registration). Goal: steady-state round / bare <= 1.10x.
With --repeat N the modes run in turn N times (bare, ray-1, ray-2, bare, ...) so that a machine whose speed drifts
slows every mode alike; the table shows each mode's medians and the verdict each repeat's ratio to its own bare.
`--smoke` (what `make test` runs): tiny-sd3 at 32 px, 2 denoising steps, 2 steps per mode (1 warm-up), 1 CPU, modes
bare, bare-1t and ray-1 (ray-2 is the same round with 2 workers: a second Ray start, ~15 s); the Prefect API and
Ray still start (most of its 50 s on 2 busy cores).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # the export reads a checkpoint alone

from rl_step import SHAPES, build_model  # noqa: E402

from unirl_core.config import load_recipe  # noqa: E402

GOAL = 1.10


def recipe(path: str, out: Path, args, workers: int = 1, cpus_per_worker: float = 1):
    return load_recipe(
        "demo",
        [
            f"train.output_dir={out}",
            f"train.model.path={path}",
            f"train.sampling.height={args.px}",
            f"train.sampling.width={args.px}",
            f"train.sampling.num_inference_steps={args.inference_steps}",
            "train.algorithm.learning_rate=1e-4",  # the demo's 0.1 is for the tiny model
            "train.eval=null",  # the computation of the steps alone (the bare loop evaluates nothing)
            f"train.steps={args.steps}",
            f"train.ray.workers={workers}",
            f"train.ray.cpus_per_worker={cpus_per_worker}",
        ],
    ).train


def summarize(mode: str, workers: int, threads: int, started: float, stamps: list[float], rows: list[dict],
              ended: float, skip: int, images: int) -> dict:  # fmt: skip
    steady = (stamps[-1] - stamps[skip - 1]) / (len(stamps) - skip)
    counted = rows[skip:]
    return {
        "mode": mode,
        "workers": workers,
        "threads": threads,
        "s_per_step": steady,
        "images_per_s": images / steady,
        "rollout": statistics.mean(r["seconds_rollout"] + r["seconds_reward"] for r in counted),
        "train": statistics.mean(r["seconds_train"] for r in counted),
        "startup": stamps[0] - started - images / rows[0]["images_per_s"],  # to the first step's start
        "finish": ended - stamps[-1],
        "wall": ended - started,
        "periods": [b - a for a, b in zip(stamps[skip - 1 :], stamps[skip:], strict=False)],
    }


def run_bare(mode: str, path: str, out: Path, args, threads: int, images: int) -> dict:
    from bare_loop import bare_steps

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        config = recipe(path, out, args)
        stamps, rows = [], []
        started = time.perf_counter()
        for row in bare_steps(config, args.steps):
            stamps.append(time.perf_counter())
            rows.append(row)
        ended = time.perf_counter()
    finally:
        torch.set_num_threads(before)
    return summarize(mode, 1, threads, started, stamps, rows, ended, args.skip, images)


def run_round(path: str, out: Path, args, workers: int, images: int) -> dict:
    from flows.train import train
    from tasks.progress import add_listener, remove_listener

    cpus = args.cpus / workers
    config = recipe(path, out, args, workers=workers, cpus_per_worker=cpus)
    stamps, rows = [], []

    def listener(kind, row):
        if kind == "train_step":
            stamps.append(time.perf_counter())
            rows.append(row)

    add_listener(listener)
    try:
        started = time.perf_counter()
        summary = train(config, run_name=f"round-overhead-{workers}w")
        ended = time.perf_counter()
    finally:
        remove_listener(listener)
    if len(rows) != args.steps:
        raise RuntimeError(f"ray-{workers}: {len(rows)} step rows reported, expected {args.steps}")
    result = summarize(f"ray-{workers}", workers, max(1, int(cpus)), started, stamps, rows, ended, args.skip, images)
    result["round_seconds"] = summary.rounds[0].seconds
    return result


def median_of(runs: list[dict]) -> dict:
    """One mode's runs as one row: the median of each figure (the per-run s/step kept for the verdict)."""
    row = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}
    return {**runs[0], **row, "runs": [r["s_per_step"] for r in runs]}


def progress(r: dict) -> None:
    periods = " ".join(f"{p:.2f}" for p in r["periods"])
    print(f"  {r['mode']}: {r['s_per_step']:.2f} s/step (steady steps: {periods}), wall {r['wall']:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mid-sd3", choices=["tiny-sd3", "mid-sd3", "wide-sd3"])
    parser.add_argument("--steps", type=int, default=5, help="RL steps per mode (one round)")
    parser.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the steady state (>= 1)")
    parser.add_argument("--inference-steps", type=int, default=4)
    parser.add_argument("--px", type=int, default=None, help="image size (default: the model's, from rl_step.py)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count(), help="CPUs of the Ray rounds (and bare threads)")
    parser.add_argument("--modes", default="bare,bare-1t,ray-1,ray-2")
    parser.add_argument("--repeat", type=int, default=1, help="run the modes in turn this many times; medians shown")
    parser.add_argument("--smoke", action="store_true", help="tiny-sd3, 32 px, 2 denoising steps, 2 steps per mode, "
                        "1 CPU, modes bare,bare-1t,ray-1 (make test's)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.model, args.steps, args.skip, args.inference_steps, args.px = "tiny-sd3", 2, 1, 2, 32
        args.cpus, args.modes, args.repeat = 1, "bare,bare-1t,ray-1", 1
    args.px = args.px or SHAPES[args.model][2]
    if not 1 <= args.skip < args.steps:
        parser.error("--skip must be at least 1 and less than --steps")
    modes = args.modes.split(",")
    unknown = set(modes) - {"bare", "bare-1t", "ray-1", "ray-2"}
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}")
    if "ray-2" in modes and args.cpus % 2:
        parser.error("ray-2 splits --cpus over 2 workers: use an even --cpus")

    from unirl_core.models.logs import quiet_model_libraries

    quiet_model_libraries()
    torch.set_num_threads(args.cpus)
    images = 8  # the demo recipe: 2 prompts x 4 samples
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="round-overhead-") as tmp, contextlib.ExitStack() as stack:
        tmp = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        path, params = build_model(args.model, tmp / "models")
        print(
            f"{args.model}: {params / 1e6:.1f} M parameters, {args.px} px, {args.inference_steps} denoising steps, "
            f"{images} images per step, {args.steps} steps per mode ({args.skip} warm-up), {args.cpus} CPUs, "
            f"{os.cpu_count()} cores on this machine, modes interleaved {args.repeat} time(s)",
            flush=True,
        )
        if any(m.startswith("ray") for m in modes):
            from mlflow.tracking import MlflowClient
            from prefect.testing.utilities import prefect_test_harness

            started = time.perf_counter()
            MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).search_experiments()  # creates the database
            created = time.perf_counter() - started
            started = time.perf_counter()
            stack.enter_context(prefect_test_harness(server_startup_timeout=120))
            print(
                f"  (not counted: MLflow sqlite created in {created:.1f} s, temporary Prefect API started in "
                f"{time.perf_counter() - started:.1f} s)",
                flush=True,
            )
        for repeat in range(args.repeat):  # bare, bare-1t, ray-1, ray-2, bare, ...: a drifting machine hits every mode
            for mode in modes:
                out = tmp / f"out-{mode}-{repeat}"
                if mode.startswith("bare"):
                    results.append(run_bare(mode, path, out, args, args.cpus if mode == "bare" else 1, images))
                else:
                    results.append(run_round(path, out, args, int(mode.split("-")[1]), images))
                progress(results[-1])
        results = [median_of([r for r in results if r["mode"] == mode]) for mode in modes]

    base = next((r for r in results if r["mode"] == "bare"), None)
    print()
    print(
        f"{'mode':<8} {'workers':>7} {'threads':>7} {'s/step':>7} {'img/s':>6} {'vs bare':>7} {'rollout':>7} "
        f"{'train':>6} {'startup s':>9} {'finish s':>8} {'wall s':>7}"
    )
    for r in results:
        ratio = f"{r['s_per_step'] / base['s_per_step']:.2f}x" if base else "-"
        print(
            f"{r['mode']:<8} {r['workers']:>7} {r['threads']:>7} {r['s_per_step']:>7.2f} {r['images_per_s']:>6.2f} "
            f"{ratio:>7} {r['rollout']:>7.2f} {r['train']:>6.2f} {r['startup']:>9.1f} {r['finish']:>8.1f} "
            f"{r['wall']:>7.1f}"
        )
    print(
        "s/step: steady state; rollout (incl. reward) and train: the slowest rank's seconds per step; startup: "
        "before the first step; finish: after the last step"
    )
    if base:
        for r in results:
            if r["mode"].startswith("ray"):
                ratio = r["s_per_step"] / base["s_per_step"]
                paired = [a / b for a, b in zip(r["runs"], base["runs"], strict=True)]  # each run / that repeat's bare
                verdict = "met" if ratio <= GOAL else "not met"
                each = f"; per repeat {' '.join(f'{p:.2f}x' for p in paired)}" if len(paired) > 1 else ""
                print(
                    f"goal <= {GOAL:.2f}x: {verdict} for {r['mode']} ({ratio:.2f}x at steady state{each}; startup "
                    f"{r['startup']:.1f} s vs {base['startup']:.1f} s bare, finish {r['finish']:.1f} s)"
                )


if __name__ == "__main__":
    main()
