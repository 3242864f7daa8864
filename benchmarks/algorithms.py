"""The named algorithms side by side on a tiny family: reward gained after N steps and wall time per step, with the
same prompts, seeds and reward (the demo recipe: jpeg_compressibility, 2 prompts x 4 samples, LoRA, 32 px).

    .venv/bin/python benchmarks/algorithms.py [--family sd3] [--steps 24] [--seeds 0,1,2] [--inference-steps 8]
    .venv/bin/python benchmarks/algorithms.py --only grpo,mixgrpo
    .venv/bin/python benchmarks/algorithms.py --family flux --only grpo --steps 16    # a family's learning claim
    .venv/bin/python benchmarks/algorithms.py --recipe demo_video --only grpo,flow_grpo_fast --steps 16 \
        --inference-steps 4                                # videos: the tiny Wan 2.1 (docs/video.md)
    .venv/bin/python benchmarks/algorithms.py --smoke     # seconds: 4 algorithms, 2 small steps (make test's)

Each algorithm runs its defaults (its config class in unirl_core/algorithms/<name>.py) with the overrides in `TINY` below,
which scale windows written for 10-28 steps to the tiny runs' 8. Every run is one rank in this process
(`unirl train --local`'s path). Printed per algorithm: the reward gain (mean of the last 4 steps minus the first 4)
for each seed and their mean, the final reward, seconds per RL step (the first step, a warm-up, left out), and the
ratio of that time to full-SDE `grpo`'s. Windows (flow_grpo_fast, mixgrpo, flow_dppo) train 2-3 of the 8 steps, so
their train phase is cheaper; mixgrpo_flash also thins the ODE steps after its window (fewer rollout forwards);
`diffusion_nft_euler` is diffusion_nft with Euler rollouts instead of the reference's DPM-Solver++ 2M.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the tiny families' recipe overrides (family_cases.py)

from family_cases import FAMILIES as TINY_FAMILIES  # noqa: E402
from family_cases import family_overrides  # noqa: E402

from unirl_core.config import load_recipe  # noqa: E402
from unirl_core.models.registry import family_class  # noqa: E402

SAME_ADVANTAGES = ["train.algorithm.std_ddof=0", "train.algorithm.adv_eps=1e-4"]  # the demo's normalization for all
TINY = {  # algorithm -> its recipe overrides on the tiny 8-step runs (the preset fills the rest)
    "grpo": [],
    "flow_grpo_fast": ["train.algorithm.name=flow_grpo_fast"],
    "mixgrpo": ["train.algorithm.name=mixgrpo", "train.algorithm.sde_window.size=2",
                "train.algorithm.sde_window.shift_every=4", *SAME_ADVANTAGES],
    "mixgrpo_flash": ["train.algorithm.name=mixgrpo_flash", "train.algorithm.sde_window.size=2",
                      "train.algorithm.sde_window.shift_every=4", "train.algorithm.sde_window.post_compress=0.6",
                      *SAME_ADVANTAGES],
    "dancegrpo": ["train.algorithm.name=dancegrpo", "train.algorithm.eta=0.7", *SAME_ADVANTAGES],
    "grpo_guard": ["train.algorithm.name=grpo_guard"],
    "flow_dppo": ["train.algorithm.name=flow_dppo", *SAME_ADVANTAGES],  # its preset: N - 1 and 1e-8, as UniRL
    "reinforce": ["train.algorithm.name=reinforce"],
    "diffusion_nft": ["train.algorithm.name=diffusion_nft"],  # DPM-Solver++ 2M rollouts, as the reference
    "diffusion_nft_euler": ["train.algorithm.name=diffusion_nft", "train.algorithm.ode_solver=euler"],
}  # fmt: skip
FAMILIES = {
    "sd3": [],
    "sd15": ["train.model.family=sd15", "train.model.path=tiny:sd15", "train.algorithm.eta=1.0",
             "train.model.lora.target_modules=[to_q,to_k,to_v,to_out.0,proj_out,conv_out]"],
    **dict.fromkeys(TINY_FAMILIES),  # tests/support/family_cases.py's overrides (edit families get edit prompts)
}  # fmt: skip
DDIM_ALGORITHMS = set(TINY) - {"dancegrpo"}  # DDIM families (sd15, sdxl) have no `dance` SDE
WINDOW = 4  # steps averaged at each end for the gain (fewer when a run has fewer than 8)
# --smoke: every algorithm's recipe is loaded (its overrides still valid), these run: the baseline, a window with
# thinned ODE steps, a `dance` SDE, the NFT loss; 1 prompt x 2 samples, 6 denoising steps (the fewest all windows fit)
SMOKE_RUNS = ("grpo", "mixgrpo_flash", "dancegrpo", "diffusion_nft")
SMOKE = [
    "train.data.prompts_per_rollout=1",
    "train.sampling.samples_per_prompt=2",
    "train.algorithm.micro_batch_size=2",
]


def recipe(name: str, family: str, seed: int, steps: int, inference_steps: int, folder: Path, extra: list[str],
           base: str = "demo"):  # fmt: skip
    """Recipe `base`'s train config for algorithm `name` on `family`: TINY's and the family's overrides, `extra`."""
    tiny = family_overrides(family, folder / "prompts") if FAMILIES[family] is None else FAMILIES[family]
    overrides = [
        *tiny, *TINY[name], f"train.steps={steps}", f"train.steps_per_round={steps}",
        f"train.sampling.num_inference_steps={inference_steps}", f"train.sampling.seed={seed}",
        f"train.data.seed={seed}", f"train.output_dir={folder}", "train.ray.workers=1",
        "train.checkpoint_every=1000", "train.eval=null", *extra,  # s/step: the steps alone
    ]  # fmt: skip
    return load_recipe(base, overrides).train


def run(config) -> list[dict]:
    """`config`'s rounds on one rank in this process (`unirl train --local`'s path): every step's metrics."""
    from unirl_core.controller import plan_rounds, run_round

    rows: list[dict] = []
    for round_ in plan_rounds(config):
        run_round(config, round_, on_step=rows.append, local=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="sd3", choices=sorted(FAMILIES))
    parser.add_argument("--recipe", default="demo", help="the tiny recipe (demo_video: the tiny Wan 2.1's videos)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--inference-steps", type=int, default=8)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--only", default="", help="comma-separated algorithms (default: all)")
    parser.add_argument("--smoke", action="store_true", help=f"seconds: every algorithm's recipe loaded, {SMOKE_RUNS} "
                        "run for 2 RL steps (1 timed) of 1 prompt x 2 samples, 6 denoising steps, seed 0 (make "
                        "test's)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.inference_steps, args.seeds, args.only = 2, 6, "0", ",".join(SMOKE_RUNS)
    names = [n for n in TINY if not args.only or n in args.only.split(",")]
    if family_class(args.family).sampler_kind == "ddim":
        names = [n for n in names if n in DDIM_ALGORITHMS]
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = SMOKE if args.smoke else []
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            loaded = [
                recipe(n, args.family, 0, args.steps, args.inference_steps, Path(tmp) / n, extra, args.recipe)
                for n in TINY
            ]
            print(f"recipes load: {len(loaded)} algorithms ({', '.join(TINY)})", flush=True)
        for name in names:
            gains, finals, seconds, train = [], [], [], []
            for seed in seeds:
                folder = Path(tmp) / f"{name}-{seed}"
                rows = run(
                    recipe(name, args.family, seed, args.steps, args.inference_steps, folder, extra, args.recipe)
                )
                rewards = [r["reward_mean"] for r in rows]
                window = max(1, min(WINDOW, len(rewards) // 2))
                gains.append(statistics.mean(rewards[-window:]) - statistics.mean(rewards[:window]))
                finals.append(statistics.mean(rewards[-window:]))
                seconds += [r["seconds_rollout"] + r["seconds_reward"] + r["seconds_train"] for r in rows[1:]]
                train += [r["seconds_train"] for r in rows[1:]]
            results[name] = (gains, finals, statistics.median(seconds), statistics.median(train))
            print(f"{name}: gains {[round(g, 3) for g in gains]}", flush=True)
    base = results["grpo"][2] if "grpo" in results else None
    config = load_recipe(args.recipe, []).train
    family = args.family if args.recipe == "demo" else config.model.family
    print(
        f"\n{family} ({args.recipe}), {args.steps} RL steps, {args.inference_steps} denoising steps, seeds {seeds}, "
        f"{' + '.join(config.reward.weights)} (higher is better)"
    )
    print(f"{'algorithm':<20} {'gain per seed':<26} {'mean gain':>9} {'final':>8} {'s/step':>7} {'train s':>7} "
          f"{'vs grpo':>8}")  # fmt: skip
    for name, (gains, finals, step_seconds, train_seconds) in results.items():
        ratio = f"{step_seconds / base:.2f}x" if base else "-"
        per_seed = " ".join(f"{g:+.3f}" for g in gains)
        print(
            f"{name:<20} {per_seed:<26} {statistics.mean(gains):>+9.3f} {statistics.mean(finals):>8.3f} "
            f"{step_seconds:>7.2f} {train_seconds:>7.2f} {ratio:>8}"
        )


if __name__ == "__main__":
    main()
