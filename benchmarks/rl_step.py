"""One full GRPO step (rollout + reward + train) on the bare loop (bare_loop.py): images/s and the phase split.

    .venv/bin/python benchmarks/rl_step.py [--steps 3] [--device cpu] [--models tiny-sd3,tiny-sd15,mid-sd3]
    .venv/bin/python benchmarks/rl_step.py --device cuda --dtype bfloat16 --models large-sd3   # on a GPU
    .venv/bin/python benchmarks/rl_step.py --smoke    # seconds: tiny-sd3, tiny-sd15, nano-sd3, 1 counted step each

Models are built from config with random weights (nothing is downloaded):
  tiny-sd3 / tiny-sd15  the test models (0.2-0.3 M parameters), 32 px
  mid-sd3               an SD3 transformer of 4 layers x 256 wide (~10 M parameters), 64 px
  wide-sd3              8 layers x 384 wide (41 M parameters), 128 px: about 140 s per step on 2 CPU cores
  large-sd3             SD3-medium-like depth: 24 layers x 1536 wide (~2 B parameters), 512 px (GPU only)
  nano-sd3              1 layer x 16 wide, 32 px, 2 steps: the smoke's (mid-sd3's path, built from overrides)
Each row: 2 prompts x 4 samples, 10 denoising steps (4 for tiny), every step stochastic, LoRA rank 8, CFG off,
jpeg_compressibility; the first step is a warm-up and is not counted. RL.md lists the field's figures for
comparison (images per GPU per second of a Flow-GRPO step on SD3.5-medium).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bare_loop import bare_steps  # noqa: E402

from unirl_core.config import recipe_from_tree  # noqa: E402

SHAPES = {  # name -> (family, transformer overrides or None for the tiny model, pixels, inference steps)
    "tiny-sd3": ("sd3", None, 32, 4),
    "tiny-sd15": ("sd15", None, 32, 4),
    "mid-sd3": ("sd3", {"num_layers": 4, "attention_head_dim": 64, "num_attention_heads": 4}, 64, 10),
    "wide-sd3": ("sd3", {"num_layers": 8, "attention_head_dim": 64, "num_attention_heads": 6}, 128, 10),
    "large-sd3": ("sd3", {"num_layers": 24, "attention_head_dim": 64, "num_attention_heads": 24}, 512, 10),
    "nano-sd3": ("sd3", {"num_layers": 1, "attention_head_dim": 8, "num_attention_heads": 2}, 32, 2),
}
SMOKE_MODELS = "tiny-sd3,tiny-sd15,nano-sd3"


def build_model(name: str, folder: Path) -> tuple[str, int]:
    """A pipeline folder for `name` and its denoiser's parameter count."""
    from diffusers import SD3Transformer2DModel

    from unirl_core.models.registry import build_tiny_pipeline
    from unirl_core.models.tiny import T5_HIDDEN

    family, overrides, size, _ = SHAPES[name]
    torch.manual_seed(0)
    pipeline = build_tiny_pipeline(family)
    if overrides:
        inner = overrides["attention_head_dim"] * overrides["num_attention_heads"]
        pipeline.transformer = SD3Transformer2DModel(
            sample_size=size // 2, patch_size=2, in_channels=4, out_channels=4,
            joint_attention_dim=T5_HIDDEN, caption_projection_dim=inner,
            pooled_projection_dim=pipeline.transformer.config.pooled_projection_dim,
            pos_embed_max_size=size // 2, **overrides,
        )  # fmt: skip
        pipeline.register_modules(transformer=pipeline.transformer)
    pipeline.save_pretrained(folder / name, safe_serialization=True)
    denoiser = pipeline.transformer if family == "sd3" else pipeline.unet
    return str(folder / name), sum(p.numel() for p in denoiser.parameters())


def measure(name: str, path: str, steps: int, device: str, dtype: str) -> dict:
    family, _, size, inference_steps = SHAPES[name]
    config = recipe_from_tree(
        {
            "train": {
                "data": {"source": "smoke", "prompts_per_rollout": 2},
                "sampling": {
                    "samples_per_prompt": 4,
                    "num_inference_steps": inference_steps,
                    "guidance_scale": 1.0,
                    "height": size,
                    "width": size,
                },
                "model": {"family": family, "path": path, "dtype": dtype},
                "algorithm": {"eta": 0.7, "learning_rate": 1e-4, "micro_batch_size": 4, "std_mode": "batch"},
                "steps": steps + 1,
            }
        }  # fmt: skip
    ).train
    rows = list(bare_steps(config, device=device))[1:]  # step 0 is a warm-up
    phases = {k: statistics.mean(r[f"seconds_{k}"] for r in rows) for k in ("rollout", "reward", "train")}
    total = sum(phases.values())
    return {"size": size, "s_per_step": total, "images_per_s": 8 / total} | {k: v / total for k, v in phases.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--models", default="tiny-sd3,tiny-sd15,mid-sd3")
    parser.add_argument("--smoke", action="store_true", help=f"seconds: {SMOKE_MODELS}, 1 counted step (make test's)")
    args = parser.parse_args()
    if args.smoke:
        args.models, args.steps = SMOKE_MODELS, 1
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    import huggingface_hub.utils

    huggingface_hub.utils.disable_progress_bars()
    print(f"device {args.device}, dtype {args.dtype}, torch threads {torch.get_num_threads()}, 8 images per step")
    print(f"{'model':<10} {'params':>8} {'px':>4} {'s/step':>8} {'img/s':>7} {'rollout':>8} {'reward':>7} {'train':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            started = time.perf_counter()
            path, params = build_model(name, Path(tmp))
            row = measure(name, path, args.steps, args.device, args.dtype)
            print(
                f"{name:<10} {params / 1e6:>7.1f}M {row['size']:>4} {row['s_per_step']:>8.2f} {row['images_per_s']:>7.2f} "
                f"{row['rollout']:>8.0%} {row['reward']:>7.0%} {row['train']:>6.0%}   ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
