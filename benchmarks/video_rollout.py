"""The video rollout vs the bare stock `WanPipeline` generating the same videos, and seconds per denoising step by
frame count.

    .venv/bin/python benchmarks/video_rollout.py            # CPU: the tiny Wan 2.1, 32 x 32 px, 4 steps
    .venv/bin/python benchmarks/video_rollout.py --full     # GPU: Wan 2.1-1.3B's transformer and VAE, 240 x 416 px,
                                                            # 20 steps, bf16 (random weights; a 1-layer umT5 of the
                                                            # real width)
    .venv/bin/python benchmarks/video_rollout.py --smoke    # seconds: 5 and 9 frames, 2 steps, 1 repeat

Both sides generate the same prompts x videos per prompt with the same model objects, guidance and size, decoded to
PIL frames: ours is `run_rollout` (GRPO's rollout: SDE with per-step log-probs on the first half of the steps, ODE
after, every stochastic step's latents kept for training), the limit is `WanPipeline.__call__`. The ratio is
pipeline seconds / rollout seconds (1.00x: no overhead; the goal is >= 0.90x). Each figure is the fastest of
`--repeats` runs after one warm-up run, since other work on a shared machine only adds time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from unirl_core.config import recipe_from_tree  # noqa: E402
from unirl_core.data.grpo_groups import expand_groups  # noqa: E402
from unirl_core.data.sources import build_source  # noqa: E402
from unirl_core.domains.diffusion.rollout.rollout import run_rollout  # noqa: E402
from unirl_core.models.registry import build_family  # noqa: E402


def full_pipeline(folder: Path) -> str:
    """Wan 2.1-1.3B's transformer and VAE (published configs, random weights) with a 1-layer umT5 of width 4096."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import ByT5Tokenizer

    from unirl_core.models.families.wan.tiny import tiny_umt5
    from unirl_core.models.real_sizes import VARIANTS

    transformer = WanTransformer3DModel(**VARIANTS["wan2.1-t2v-1.3b"]["components"]["transformer"][3])
    tokenizer = ByT5Tokenizer()
    text = tiny_umt5(len(tokenizer), width=4096)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    WanPipeline(tokenizer=tokenizer, text_encoder=text, vae=AutoencoderKLWan(), scheduler=scheduler,
                transformer=transformer).save_pretrained(folder)  # fmt: skip
    return str(folder)


def config_for(args, path: str, frames: int):
    return recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": args.prompts},
        "sampling": {"samples_per_prompt": args.per_prompt, "num_inference_steps": args.steps, "guidance_scale": 4.5,
                     "height": args.height, "width": args.width, "num_frames": frames},
        "model": {"family": "wan", "path": path, "dtype": args.dtype,
                  "lora": {"rank": 8, "alpha": 16, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"]}},
        "algorithm": {"eta": 0.7, "timestep_fraction": 0.5},
    }}).train  # fmt: skip


def fastest(run, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(args, path: str, frames: int) -> tuple[float, float]:
    """(rollout seconds, pipeline seconds) for one batch of videos of `frames` frames."""
    config = config_for(args, path, frames)
    family = build_family(config.model, config.sampling, device=args.device)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    prompts = [s.example.prompt for s in samples]

    def ours():
        run_rollout(family, samples, config.sampling, config.algorithm, seed=0)

    def stock():
        with torch.no_grad():
            family.pipeline(prompt=prompts, negative_prompt="", height=args.height, width=args.width,
                            num_frames=frames, num_inference_steps=args.steps, guidance_scale=4.5,
                            generator=torch.Generator().manual_seed(0), output_type="pil")  # fmt: skip

    return fastest(ours, args.repeats), fastest(stock, args.repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="Wan 2.1-1.3B's shape on a GPU")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny shapes, 1 repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    args.device = "cuda" if args.full and torch.cuda.is_available() else "cpu"
    args.dtype = "bfloat16" if args.full else "float32"
    args.height, args.width, args.steps = (240, 416, 20) if args.full else (32, 32, 2 if args.smoke else 4)
    args.prompts, args.per_prompt = (1, 2) if args.smoke else (2, 4)
    args.repeats = 1 if args.smoke else args.repeats
    counts = (5, 9) if args.smoke else ((17, 33) if args.full else (9, 17, 33))
    torch.manual_seed(0)
    path = "tiny:wan"
    if args.full:
        import tempfile

        path = full_pipeline(Path(tempfile.mkdtemp(prefix="wan-full-")))
    videos = args.prompts * args.per_prompt
    print(f"{videos} videos of {args.height}x{args.width}, {args.steps} steps, CFG 4.5, on {args.device}")
    print(f"{'frames':<8}{'rollout s':>12}{'pipeline s':>12}{'s/step/video':>14}{'ratio':>8}")
    for frames in counts:
        rollout, stock = measure(args, path, frames)
        print(
            f"{frames:<8}{rollout:>12.3f}{stock:>12.3f}{rollout / args.steps / videos:>14.4f}{stock / rollout:>7.2f}x"
        )


if __name__ == "__main__":
    main()
