"""Torchtitan's rule for refactors: a fixed seed gives the same per-step metrics and the same weights, bitwise.

    .venv/bin/python benchmarks/refactor_equivalence.py record benchmarks/reference/refactor_equivalence.json
    .venv/bin/python benchmarks/refactor_equivalence.py check  benchmarks/reference/refactor_equivalence.json
    .venv/bin/python benchmarks/refactor_equivalence.py --smoke     # one 1-step run recorded and checked (make test's)

Runs the packaged recipes through the `unirl` command, each in a fresh workspace (its own UNIRL_HOME, sqlite MLflow
and temporary Prefect API):

  demo           `unirl train demo`: 24 RL steps on 2 Ray workers (FSDP2, gloo)
  pipeline_demo  `unirl demo`: synthetic data -> ingest -> precache -> 8 warm-up steps -> 24 RL steps in 3 rounds

  demo_<name>    `unirl train demo_<name> --local --steps 12`: each packaged algorithm demo, one rank
  demo_reinforce the demo with `train.algorithm.name=reinforce` (no packaged demo)
  demo_grpo_kl   the demo with a KL term (flow_grpo's form), 2 updates of 2 micro-batches, CFG 4.5 with the
                 unconditional branch detached (the train stack's other paths), 6 steps
  family_<f>     the demo on each other tiny family (sd3 is the demo's), its test overrides, 4 steps, `--local`

and records, per run, every step's `metrics.jsonl` row without its timings (the last row of each step), and the
sha256 of each tensor of the exported adapter (`adapter_model.safetensors`). `check` runs them again and prints,
per run, the steps and tensors that differ (exit 1 if any). Only the command line, the metrics file and the export
are used, so the same script runs on the code before and after a refactor (`--code DIR` runs another checkout's).
Bitwise equality holds on one machine kind (the same CPU instructions); record and check on the same one.
`--smoke` runs `unirl train demo --local --steps 1` (no evaluation, one thread) once, records it into a temporary
reference and checks it against what the file holds (the tool's path: the command, the metrics and the export read,
the record written, read back and compared); a rerun's bitwise equality is not its question (a second run doubles
its ~15 s).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VOLATILE = ("seconds", "_per_s")  # timings
ALGORITHM_DEMOS = [
    "dancegrpo",
    "diffusion_nft",
    "flow_dppo",
    "flow_grpo_fast",
    "grpo_guard",
    "mixgrpo",
    "mixgrpo_flash",
]
FLUX2_LORA = "[to_q,to_k,to_v,to_out.0,add_q_proj,add_k_proj,add_v_proj,to_add_out,ff.linear_in,ff.linear_out,"
FLUX2_LORA += "ff_context.linear_in,ff_context.linear_out,to_qkv_mlp_proj,proj_out,norm_out.linear]"
FAMILIES = {  # family -> its tiny's overrides (tests/support/family_cases.py); edit families get edit prompts
    "sd15": ["train.algorithm.eta=1.0"],
    "sdxl": ["train.model.lora.target_modules=[to_q,to_k,to_v,to_out.0,proj_out,conv_out]", "train.algorithm.eta=1.0",
             "train.algorithm.timestep_fraction=0.5"],
    "flux": [],
    "flux_schnell": [],
    "flux_kontext": ["train.eval=null"],  # train.eval's prompt sets carry no condition images
    "flux2_klein": [f"train.model.lora.target_modules={FLUX2_LORA}"],
    "qwen_image": [],
    "qwen_image_edit": ["train.eval=null"],
}  # fmt: skip
EDIT_FAMILIES = {"flux_kontext", "qwen_image_edit"}


def _sets(*overrides: str) -> list[str]:
    return [part for override in overrides for part in ("--set", override)]


RUNS: dict[str, list[str]] = {
    "demo": ["train", "demo"],
    "pipeline_demo": ["demo"],
    **{f"demo_{name}": ["train", f"demo_{name}", "--local", "--steps", "12"] for name in ALGORITHM_DEMOS},
    "demo_reinforce": ["train", "demo", "--local", "--steps", "12", *_sets("train.algorithm.name=reinforce")],
    "demo_llm": ["train", "demo_llm", "--local", "--steps", "8"],
    "demo_grpo_kl": ["train", "demo", "--local", "--steps", "6", *_sets(
        "train.algorithm.beta=0.04", "train.algorithm.kl_form=flow_grpo", "train.algorithm.num_updates_per_batch=2",
        "train.algorithm.micro_batch_size=2", "train.sampling.guidance_scale=4.5",
        "train.algorithm.cfg_gradient=detach_uncond")],
    **{f"family_{f}": ["train", "demo", "--local", "--steps", "4", *_sets(
        f"train.model.family={f}", f"train.model.path=tiny:{f}", *extra)] for f, extra in FAMILIES.items()},
}  # fmt: skip
SMOKE_RUN = ["train", "demo", "--local", "--steps", "1", *_sets("train.eval=null", "train.ray.cpus_per_worker=1")]


def metric_rows(output_dir: Path) -> dict[str, dict]:
    rows = {}
    for line in (output_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[str(row["step"])] = {k: v for k, v in row.items() if not any(part in k for part in VOLATILE)}
    return rows


def weight_digests(output_dir: Path) -> dict[str, str]:
    from safetensors.numpy import load_file

    (adapter,) = sorted(output_dir.glob("export/step_*/adapter_model.safetensors")) or sorted(
        output_dir.glob("export/step_*/model.safetensors")  # lora: null (demo_llm): the whole model
    )
    return {k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in sorted(load_file(str(adapter)).items())}


def edit_prompts(name: str, home: Path, code: Path, env: dict) -> list[str]:
    """An edit family's demo prompts (instructions with condition images), written by the checkout's own CLI helper."""
    family = name.removeprefix("family_")
    if family not in EDIT_FAMILIES:
        return []
    script = f"from pathlib import Path; from flows.cli import demo_prompts; print(demo_prompts({family!r}, Path({str(home)!r}), 8))"
    path = subprocess.run([sys.executable, "-c", script], cwd=code, env=env, capture_output=True, text=True, check=True)
    return _sets("train.data.source=file", f"train.data.data_path={path.stdout.strip().splitlines()[-1]}")


def run(name: str, code: Path, command: list[str] | None = None) -> dict:
    """`name`'s run of RUNS (or `command`, the `unirl` arguments) in a fresh workspace: its metrics and weights."""
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
        args = (command or RUNS[name]) + edit_prompts(name, home, code, env)
        done = subprocess.run([*unirl, *args], cwd=code, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{name}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        output_dir = home / "outputs" / (args[1] if args[0] == "train" else name)
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


def record(results: dict, reference: Path) -> None:
    reference.parent.mkdir(parents=True, exist_ok=True)
    if reference.is_file():  # record a subset: the other runs' references stay
        results = json.loads(reference.read_text()) | results
    reference.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    for name, result in results.items():
        print(f"{name}: recorded {len(result['metrics'])} steps, {len(result['weights'])} adapter tensors")


def check(results: dict, reference: Path) -> bool:
    """Prints each run's differences from `reference`; True when every run is bitwise equal."""
    recorded = json.loads(reference.read_text())
    equal = True
    for name, result in results.items():
        found = differences(recorded[name], result)
        steps, tensors = len(result["metrics"]), len(result["weights"])
        if found:
            equal = False
            print(f"{name}: DIFFERENT ({steps} steps, {tensors} tensors)\n  " + "\n  ".join(found[:20]))
        else:
            print(f"{name}: bitwise equal: {steps} steps of metrics, {tensors} adapter tensors")
    return equal


def smoke(code: Path) -> bool:
    """SMOKE_RUN once, recorded into a temporary reference, then checked against the file's record of it."""
    results = {"smoke": run("smoke", code, SMOKE_RUN)}
    with tempfile.TemporaryDirectory(prefix="equivalence-smoke-") as tmp:
        reference = Path(tmp) / "reference.json"
        record(results, reference)
        return check(results, reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["record", "check"])
    parser.add_argument("reference", nargs="?", type=Path)
    parser.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to run")
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated: " + ", ".join(RUNS))
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (each its own processes)")
    parser.add_argument("--smoke", action="store_true", help="record and check one 1-step run (make test's)")
    args = parser.parse_args()
    if args.smoke:
        raise SystemExit(0 if smoke(args.code.resolve()) else 1)
    if args.mode is None or args.reference is None:
        parser.error("record or check, and the reference file, are required (or --smoke)")
    names = args.runs.split(",")
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(names, pool.map(lambda name: run(name, args.code.resolve()), names), strict=True))
    if args.mode == "record":
        record(results, args.reference)
        return
    raise SystemExit(0 if check(results, args.reference) else 1)


if __name__ == "__main__":
    main()
