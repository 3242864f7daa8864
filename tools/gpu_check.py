"""`make gpu-check`: the GPU acceptance run, on one CUDA GPU, within a time budget; a JSON and a Markdown report.

    python tools/gpu_check.py [--out DIR] [--budget-s 480] [--only NAME,...]

Each check runs in its own process with its own time limit, in this order, while the budget lasts:

  gpu_tests        the GPU-marked tests (bf16 compute over float32 master weights, the first update's importance
                   ratio exactly 1, `train.deterministic` repeating a step bitwise, text encoders on the CPU)
  local_resume     `unirl train demo --local --device cuda`: 4 steps in one round vs the same 4 steps as 2 rounds of 2
                   (the second resumes from the first's checkpoint on the GPU): metrics and exported weights equal
                   bitwise; the one-rank FSDP2 round through the same controller and worker code as on CPU
  deterministic    the same 2 steps twice with `train.deterministic: true`: metrics and weights equal bitwise
  sd35_step        a real-size SD3.5-medium LoRA GRPO step from random weights (`benchmarks/rl_throughput.py --full`,
                   bf16, 512 px, 10 steps, 16 images): images/s, the phase split, rollout vs the bare diffusers
                   pipeline, and peak memory per phase vs `unirl plan`'s estimate of the same shape (goal +-20 %)
  flux_step        the same with FLUX.1-dev's transformer (19 double + 38 single blocks x 3072, 11.9 B parameters,
                   guidance embedded: no negative branch) at 512 px: it fits and runs; figures and memory vs plan

Without a CUDA device every check is skipped with its reason and the command exits 0 (CI runs it so). A check that
fails makes the exit code 1; the reports say which and why (the last lines of its output). Reports:
`<out>/gpu_check.json` ({"device", "checks": [{name, status, seconds, figures, reason}]}) and `<out>/gpu_check.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU_TEST_FILES = ["tests/integration/test_gpu_precision.py", "tests/unit/test_determinism.py",
                  "tests/unit/test_text_encoder_placement.py"]  # fmt: skip


def cuda_device() -> str | None:
    """The GPU's name, or None without CUDA (torch missing counts as none)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def run(command: list[str], timeout: float, env: dict | None = None) -> tuple[int, str]:
    """(exit code, output) of `command` in the checkout; 124 when it ran past `timeout`."""
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n(stopped after {timeout:.0f} s)"
    return done.returncode, done.stdout + done.stderr


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def unirl(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from flows.supervise import main; sys.argv[0] = 'unirl'; "
            "sys.exit(main())", *args]  # fmt: skip


# --- the checks: each returns (passed, figures, reason) ----------------------------------------------------------


def check_gpu_tests(timeout: float) -> tuple[bool, dict, str]:
    code, out = run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", *GPU_TEST_FILES],
                    timeout)  # fmt: skip
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", out)}
    return code == 0, counts, "" if code == 0 else tail(out)


def check_local_resume(timeout: float) -> tuple[bool, dict, str]:
    runs = {"one_round": [], "two_rounds": ["--set", "train.steps_per_round=2"]}
    return compare_runs(runs, ["--set", "train.steps=4"], timeout, "the run resumed from a checkpoint")


def check_deterministic(timeout: float) -> tuple[bool, dict, str]:
    runs = {"first": [], "second": []}
    return compare_runs(runs, ["--set", "train.steps=2", "--set", "train.deterministic=true"], timeout, "a repeat")


def compare_runs(runs: dict[str, list[str]], common: list[str], timeout: float, what: str) -> tuple[bool, dict, str]:
    """`unirl train demo --local --device cuda` once per entry of `runs` (its own arguments after `common`), each in
    its own output folder: their metrics (timings and round index left out) and exported adapters must be equal."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"UNIRL_HOME": f"{tmp}/home", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
        started = time.monotonic()
        for name, extra in runs.items():
            args = ["train", "demo", "--local", "--device", "cuda", *common, "--set", f"train.output_dir={tmp}/{name}",
                    *extra]  # fmt: skip
            code, out = run(unirl(*args), timeout - (time.monotonic() - started), env)
            if code != 0:
                return False, {}, f"{name}: exit {code}\n{tail(out)}"
        rows = {name: _rows(Path(tmp) / name / "metrics.jsonl") for name in runs}
        weights = {name: _adapter_digest(Path(tmp) / name / "export") for name in runs}
    first, *others = runs
    figures = {"steps": len(rows[first]), "reward_mean": [r["reward_mean"] for r in rows[first]],
               "grad_norm": [r["grad_norm"] for r in rows[first]]}  # fmt: skip
    for name in others:
        if rows[name] != rows[first]:
            return False, figures, f"{what} ({name}): metrics differ from {first}'s"
        if weights[name] != weights[first]:
            return False, figures, f"{what} ({name}): the exported adapter differs from {first}'s"
    return True, figures, ""


def _rows(path: Path) -> list[dict]:
    """The last row of each step, without timings and the round's index."""
    rows = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = {k: v for k, v in row.items() if "seconds" not in k and "_per_s" not in k and k != "round"}
    return [rows[step] for step in sorted(rows)]


def _adapter_digest(export: Path) -> str:
    import hashlib

    from safetensors.torch import load_file

    (adapter,) = export.glob("*/adapter_model.safetensors")
    digest = hashlib.sha256()
    for key, tensor in sorted(load_file(adapter).items()):
        digest.update(key.encode() + tensor.float().cpu().numpy().tobytes())
    return digest.hexdigest()


def step_check(model: str, timeout: float) -> tuple[bool, dict, str]:
    """A real-size LoRA GRPO step of `model` (`benchmarks/rl_throughput.py --full --model`): its figures and peak
    memory per phase vs `unirl plan`'s estimate of the same shape."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "rl_throughput.json"
        code, out = run([sys.executable, "benchmarks/rl_throughput.py", "--full", "--model", model, "--steps", "1",
                         "--json", str(report)], timeout)  # fmt: skip
        if code != 0 or not report.is_file():
            return False, {}, f"exit {code}\n{tail(out)}"
        measured = json.loads(report.read_text())
    plan = planned_gib(measured)
    figures = {**measured, "plan_gib": plan}
    ratios = {phase: measured["peak_gib"][phase] / plan[phase] for phase in plan if plan[phase]}
    figures["peak_vs_plan"] = ratios
    off = {phase: ratio for phase, ratio in ratios.items() if not 0.8 <= ratio <= 1.2}
    reason = "; ".join(f"{phase} peak {ratio:.2f}x the plan's (goal 0.8-1.2)" for phase, ratio in off.items())
    return True, figures, reason  # the memory goal is reported, not failed: the estimate is what it measures


def check_sd35_step(timeout: float) -> tuple[bool, dict, str]:
    return step_check("sd3.5-medium", timeout)


def planned_gib(measured: dict) -> dict[str, float]:
    """`unirl plan`'s GiB for the benchmark's shape: the rollout and training terms but the text encoders' and the
    VAE's weights (the benchmark's are tiny ones of the real output shapes)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    from unirl_core.controller.memory import memory_plan

    shape = measured["shape"]
    plan = memory_plan(_recipe(shape), shape["model"])
    kept = lambda terms: sum(v for k, v in terms.items() if not k.startswith(("text encoders", "VAE")))  # noqa: E731
    return {"rollout": kept(plan.rollout), "train": kept(plan.training)}


def _recipe(shape: dict):
    from unirl_core.config import recipe_from_tree

    return recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": shape["prompts"]},
        "sampling": {"samples_per_prompt": shape["group"], "num_inference_steps": shape["inference_steps"],
                     "guidance_scale": shape["guidance_scale"], "height": shape["size"], "width": shape["size"]},
        "model": {"family": shape["family"], "path": shape["model"], "dtype": shape["dtype"],
                  "text_encoders": "device",
                  "lora": {"rank": 32, "alpha": 64, "target_modules": shape["lora_targets"]}},
        "algorithm": {"micro_batch_size": shape["micro_batch"], "num_updates_per_batch": 2},
        "ray": {"workers": 1},
    }}).train  # fmt: skip


def check_flux_step(timeout: float) -> tuple[bool, dict, str]:
    return step_check("flux1-dev", timeout)


CHECKS = {  # name -> (check, its share of the budget)
    "gpu_tests": (check_gpu_tests, 0.15),
    "local_resume": (check_local_resume, 0.15),
    "deterministic": (check_deterministic, 0.1),
    "sd35_step": (check_sd35_step, 0.3),
    "flux_step": (check_flux_step, 0.3),
}


def run_checks(names: list[str], budget_s: float, device: str | None) -> list[dict]:
    results, started = [], time.monotonic()
    for name in names:
        check, share = CHECKS[name]
        left = budget_s - (time.monotonic() - started)
        result = {"name": name, "status": "skip", "seconds": 0.0, "figures": {}, "reason": ""}
        if device is None:
            result["reason"] = "no CUDA device (torch.cuda.is_available() is False)"
        elif left < 20:
            result["reason"] = f"the budget of {budget_s:.0f} s is spent"
        else:
            began = time.monotonic()
            try:
                passed, figures, reason = check(max(20.0, min(left, share * budget_s * 2)))
            except Exception as exc:  # a check's own bug is its failure, not the whole run's
                passed, figures, reason = False, {}, f"{type(exc).__name__}: {exc}"
            status = "skip" if passed is None else "pass" if passed else "fail"
            result |= {"status": status, "seconds": round(time.monotonic() - began, 1), "figures": figures,
                       "reason": reason}  # fmt: skip
        print(f"{name}: {result['status']} ({result['seconds']} s) {result['reason'].splitlines()[0] if result['reason'] else ''}",
              flush=True)  # fmt: skip
        results.append(result)
    return results


def markdown(device: str | None, results: list[dict]) -> str:
    lines = [f"# GPU check: {device or 'no CUDA device'}", "", "| check | status | s | figures | reason |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        figures = json.dumps(r["figures"], sort_keys=True)[:300] if r["figures"] else ""
        reason = r["reason"].replace("\n", " / ").replace("|", "/")[:300]
        lines.append(f"| {r['name']} | {r['status']} | {r['seconds']} | {figures} | {reason} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="folder of the reports")
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds for all checks (default 8 minutes)")
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated: " + ", ".join(CHECKS))
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        print(f"error: --only {','.join(unknown)}: choose from {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    device = cuda_device()
    results = run_checks(names, args.budget_s, device)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps({"device": device, "checks": results}, indent=1))
    (args.out / "gpu_check.md").write_text(markdown(device, results))
    failed = [r["name"] for r in results if r["status"] == "fail"]
    print(f"{len(results)} checks: {len(failed)} failed{' (' + ', '.join(failed) + ')' if failed else ''}; "
          f"reports in {args.out}/gpu_check.{{json,md}}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
