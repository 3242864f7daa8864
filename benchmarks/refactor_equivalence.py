"""Torchtitan's rule for refactors: a fixed seed gives the same per-step metrics and the same weights, bitwise.

    .venv/bin/python benchmarks/refactor_equivalence.py record benchmarks/reference/refactor_equivalence.json
    .venv/bin/python benchmarks/refactor_equivalence.py check  benchmarks/reference/refactor_equivalence.json

Runs the packaged recipes through the `unirl` command, each in a fresh workspace (its own UNIRL_HOME, sqlite MLflow
and temporary Prefect API):

  demo           `unirl train demo`: 24 RL steps on 2 Ray workers (FSDP2, gloo)
  pipeline_demo  `unirl demo`: synthetic data -> ingest -> precache -> 8 warm-up steps -> 24 RL steps in 3 rounds

and records, per run, every step's `metrics.jsonl` row without its timings (the last row of each step), and the
sha256 of each tensor of the exported adapter (`adapter_model.safetensors`). `check` runs them again and prints,
per run, the steps and tensors that differ (exit 1 if any). Only the command line, the metrics file and the export
are used, so the same script runs on the code before and after a refactor (`--code DIR` runs another checkout's).
Bitwise equality holds on one machine kind (the same CPU instructions); record and check on the same one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

VOLATILE = ("seconds", "_per_s")  # timings
RUNS = {
    "demo": ["train", "demo"],
    "pipeline_demo": ["demo"],
}


def metric_rows(output_dir: Path) -> dict[str, dict]:
    rows = {}
    for line in (output_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[str(row["step"])] = {k: v for k, v in row.items() if not any(part in k for part in VOLATILE)}
    return rows


def weight_digests(output_dir: Path) -> dict[str, str]:
    from safetensors.numpy import load_file

    (adapter,) = sorted(output_dir.glob("export/step_*/adapter_model.safetensors"))
    return {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in sorted(load_file(str(adapter)).items())}


def run(name: str, code: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"equivalence-{name}-") as tmp:
        home = Path(tmp)
        env = {
            **os.environ,
            "UNIRL_HOME": str(home),
            "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
            "PREFECT_HOME": str(home / "prefect"),
            "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": str(code),
        }
        unirl = [sys.executable, "-c", "from flows.cli import app; app()"]
        done = subprocess.run([*unirl, *RUNS[name]], cwd=code, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{name}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        output_dir = home / "outputs" / name
        return {"metrics": metric_rows(output_dir), "weights": weight_digests(output_dir)}


def differences(expected: dict, got: dict) -> list[str]:
    found = []
    for step in sorted(set(expected["metrics"]) | set(got["metrics"]), key=int):
        want, have = expected["metrics"].get(step), got["metrics"].get(step)
        if want != have:
            keys = sorted(k for k in set(want or {}) | set(have or {}) if (want or {}).get(k) != (have or {}).get(k))
            found.append(
                f"step {step}: {', '.join(f'{k} {(want or {}).get(k)} -> {(have or {}).get(k)}' for k in keys)}"
            )
    changed = sorted(
        k for k in set(expected["weights"]) | set(got["weights"]) if expected["weights"].get(k) != got["weights"].get(k)
    )
    if changed:
        found.append(f"{len(changed)} of {len(expected['weights'])} adapter tensors differ, e.g. {changed[:3]}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["record", "check"])
    parser.add_argument("reference", type=Path)
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to run")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated: " + ", ".join(RUNS))
    args = parser.parse_args()
    names = args.runs.split(",")
    results = {name: run(name, args.code.resolve()) for name in names}
    if args.mode == "record":
        args.reference.parent.mkdir(parents=True, exist_ok=True)
        args.reference.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        for name, result in results.items():
            print(f"{name}: recorded {len(result['metrics'])} steps, {len(result['weights'])} adapter tensors")
        return
    reference = json.loads(args.reference.read_text())
    failed = False
    for name, result in results.items():
        found = differences(reference[name], result)
        steps, tensors = len(result["metrics"]), len(result["weights"])
        if found:
            failed = True
            print(f"{name}: DIFFERENT ({steps} steps, {tensors} tensors)\n  " + "\n  ".join(found[:20]))
        else:
            print(f"{name}: bitwise equal: {steps} steps of metrics, {tensors} adapter tensors")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
