"""Warm-up steps/s with precached encodings vs encoding on the fly (NeMo claims up to +60% for precaching).

    .venv/bin/python benchmarks/warmup_precache_gain.py [--model tiny-sd3] [--steps N] [--batch 4] [--samples 32]
    .venv/bin/python benchmarks/warmup_precache_gain.py --model sized-sd3   # SD3.5-medium-like encoding share
    .venv/bin/python benchmarks/warmup_precache_gain.py --smoke      # seconds: tiny-sd3, 4 samples, 1 timed step

One process, no Ray, torch threads = all cores (--threads). A real precache (`run_task`: AutoencoderKLEncoder latents and
PipelinePromptEncoder conditioning, float32) of --samples procedural PNGs with distinct captions is built first, for
a model built from config with random weights (nothing is downloaded). Then the same warm-up steps run twice, each
with a fresh LoRA adapter (the demo recipe's rank 8) and the trainer's `WarmupStack` (AdamW, gradient clipping):

  on the fly   the batch's images (decoded, at the model's size) -> adapter.encode_images (VAE encode) and its
               captions -> adapter.encode_texts (CLIP x 2 + T5), then denoising_loss, backward, optimizer step
  precached    WarmupData.next_batch (the cache indexed once before timing; a batch read by offset) -> the same
               training step

Both visit the same batches in the same order with the same noise draws, so their losses agree (printed). Image
decoding and resizing are not timed on either side (a data loader's job).

  tiny-sd3  the test model (80 k-parameter MMDiT, 2 x CLIP 32 wide, 1-layer T5, 2-block VAE), 32 px
  sized-sd3 a 31 M-parameter MMDiT (6 layers x 384) behind larger encoders: an 8x VAE (4 blocks, 16-64 channels,
            16 latent channels), 2 x CLIP (4 layers x 128) and T5 (4 layers x 256, 256 tokens), 256 px, so that
            encoding takes about the share of a step it takes for SD3.5-medium at 512 px: per sample T5-XXL
            ~2.4 TFLOP + CLIP-G/L ~0.1 + VAE encoder ~1.1 vs the MMDiT's forward and backward ~14 (LoRA) to
            ~21 (full) TFLOP, i.e. roughly 15-20% (rough FLOP counts; on this CPU it measures 13-15%)
Removing the encoding alone gives 1 / (1 - encoding share); it is printed next to the measured ratio.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from unirl_core.config import load_recipe  # noqa: E402
from unirl_core.config.precache import PrecacheConfig  # noqa: E402
from unirl_core.io.tars import TarShardWriter  # noqa: E402
from unirl_core.precache.run import run_task  # noqa: E402

PRESETS = {  # name -> (pixels, default timed steps, encoder sizes or None for the tiny test model)
    "tiny-sd3": (32, 40, None),
    "sized-sd3": (256, 10, {"vae": (16, 32, 64, 64), "clip": (128, 4), "t5": (256, 4, 1024), "mmdit": (6, 6)}),
}
WORDS = ["red", "blue", "green", "small", "large", "house", "tree", "river", "sky", "stone", "glass", "night", "morning",
         "city", "field", "cat", "dog", "bird"]  # fmt: skip


def build_model(name: str, folder: Path) -> dict[str, int]:
    """A StableDiffusion3Pipeline folder for preset `name`; returns parameter counts per component."""
    from unirl_core.models.registry import build_tiny_pipeline

    sizes = PRESETS[name][2]
    pipeline = build_tiny_pipeline("sd3") if sizes is None else _sized_sd3(PRESETS[name][0], sizes)
    pipeline.save_pretrained(folder, safe_serialization=True)
    modules = {k: m for k, m in pipeline.components.items() if isinstance(m, torch.nn.Module)}
    return {k: sum(p.numel() for p in m.parameters()) for k, m in modules.items()}


def _sized_sd3(size: int, sizes: dict):
    """The tiny model's architecture (byte-level tokenizers) at the widths of `sizes`."""
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import ByT5Tokenizer, CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    from unirl_core.models.tiny import CLIP_MAX_LENGTH, byte_level_clip_tokenizer

    torch.manual_seed(0)
    clip_width, clip_layers = sizes["clip"]
    t5_width, t5_layers, t5_ff = sizes["t5"]
    layers, heads = sizes["mmdit"]
    tokenizer = byte_level_clip_tokenizer()

    def clip():
        return CLIPTextModelWithProjection(
            CLIPTextConfig(
                vocab_size=len(tokenizer), hidden_size=clip_width, intermediate_size=4 * clip_width,
                num_hidden_layers=clip_layers, num_attention_heads=clip_width // 32,
                max_position_embeddings=CLIP_MAX_LENGTH, projection_dim=clip_width, bos_token_id=0, eos_token_id=1,
                pad_token_id=1, hidden_act="gelu",
            )
        )  # fmt: skip

    t5_tokenizer = ByT5Tokenizer()
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=len(t5_tokenizer), d_model=t5_width, d_kv=64, d_ff=t5_ff, num_layers=t5_layers,
            num_heads=t5_width // 64, decoder_start_token_id=0,
        )
    )  # fmt: skip
    channels = sizes["vae"]
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * len(channels), up_block_types=("UpDecoderBlock2D",) * len(channels),
        block_out_channels=channels, layers_per_block=2, latent_channels=16, norm_num_groups=min(32, channels[0]), sample_size=size,
        scaling_factor=1.5305, shift_factor=0.0609,  # SD3's
    )  # fmt: skip
    latent = size // 2 ** (len(channels) - 1)
    transformer = SD3Transformer2DModel(
        sample_size=latent, patch_size=2, in_channels=16, out_channels=16, num_layers=layers,
        attention_head_dim=64, num_attention_heads=heads, joint_attention_dim=t5_width,
        caption_projection_dim=64 * heads, pooled_projection_dim=2 * clip_width, pos_embed_max_size=latent,
    )  # fmt: skip
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
        text_encoder=clip(), tokenizer=tokenizer, text_encoder_2=clip(), tokenizer_2=byte_level_clip_tokenizer(),
        text_encoder_3=t5, tokenizer_3=t5_tokenizer,
    )  # fmt: skip


def make_data(folder: Path, samples: int, size: int, per_shard: int = 16) -> dict[str, tuple[Image.Image, str]]:
    """Source shards of procedural PNGs (gradients and blocks, lossless) and distinct captions; key -> (image, text)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size] / size
    sources = {}
    for first in range(0, samples, per_shard):
        shard = f"{first // per_shard:05d}.tar"
        with TarShardWriter(str(folder / shard)) as writer:
            for i in range(first, min(samples, first + per_shard)):
                a, b, c = rng.uniform(0, 1, 3)
                pixels = np.stack([a * xx + (1 - a) * yy, np.sin(6 * b * xx) ** 2, c * (xx * yy)], axis=-1)
                y0, x0 = rng.integers(0, size // 2, 2)
                pixels[y0 : y0 + size // 3, x0 : x0 + size // 3] = rng.uniform(0, 1, 3)
                image = Image.fromarray((pixels * 255).astype(np.uint8))
                text = f"sample {i}: " + " ".join(rng.choice(WORDS, int(rng.integers(3, 12))))
                out = io.BytesIO()
                image.save(out, "PNG")
                writer.write(f"{i:09d}", {"png": out.getvalue(), "txt": text.encode()})
                sources[f"{shard}/{i:09d}"] = (image, text)
            writer.commit()
    return sources


def precache_config(src: Path, out: Path, model: str, size: int, batch: int) -> PrecacheConfig:
    return PrecacheConfig.model_validate(
        {
            "input_dir": str(src),
            "output_dir": str(out),
            "batch_size_per_GPU": batch,
            "dataloader_num_workers": 0,
            "image_transform": {"size": size},
            "encodings": [
                {"modality": "image", "extension": "png", "key": "latent", "precision": 32,
                 "encoder_config": {"cls": "unirl_core.precache.encoders.AutoencoderKLEncoder", "pretrained": model}},
                {"modality": "text", "extension": "txt", "key": "prompt", "precision": 32,
                 "encoder_config": {"cls": "unirl_core.precache.encoders.PipelinePromptEncoder", "pretrained": model,
                                    "family": "sd3"}},
            ],
        }
    )  # fmt: skip


def run(mode: str, config, data, sources, steps: int, skip: int) -> dict:
    """`skip` + `steps` warm-up steps; times the last `steps`. On the fly, the batches come from `data` too (its
    keys only), so both modes train on the same samples in the same order."""
    from unirl_core.data.noise import sample_seed
    from unirl_core.domains.diffusion.stack import WarmupStack
    from unirl_core.models.registry import build_family

    data.load_state_dict(data.state_dict() | {"epoch": 0, "batch_in_epoch": 0})
    torch.manual_seed(0)  # the same initial LoRA weights in both modes
    adapter = build_family(config.model, config.sampling)
    stack = WarmupStack(adapter, config.warmup, config.algorithm.max_grad_norm)
    losses, seconds, encoding = [], [], []
    for step in range(skip + steps):
        started = time.perf_counter()
        batch = data.next_batch()
        if mode == "on the fly":
            images, texts = zip(*(sources[k] for k in batch["keys"]), strict=True)
            latents = adapter.encode_images(list(images))
            cond = adapter.encode_texts(list(texts))
        else:
            latents, cond = batch["latents"], batch["cond"]
        encoded = time.perf_counter()
        generators = [torch.Generator().manual_seed(sample_seed(config.warmup.seed, f"{step}:{key}"))
                      for key in batch["keys"]]  # fmt: skip  # as TrainWorker: per sample
        metrics = stack.train(latents, cond, generators, step)
        if step >= skip:
            seconds.append(time.perf_counter() - started)
            encoding.append(encoded - started)
        losses.append(metrics["loss"])
    total = sum(seconds)
    return {"mode": mode, "steps_per_s": len(seconds) / total, "s_per_step": total / len(seconds),
            "input_share": sum(encoding) / total, "losses": losses, "median": statistics.median(seconds)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-sd3", choices=list(PRESETS))
    parser.add_argument("--steps", type=int, default=None, help="timed steps per mode (default: the preset's)")
    parser.add_argument("--skip", type=int, default=2, help="untimed warm-up steps first")
    parser.add_argument("--batch", type=int, default=4, help="samples per step (warm-up batch_size)")
    parser.add_argument("--samples", type=int, default=32, help="samples precached (epochs repeat)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--smoke", action="store_true", help="seconds: tiny-sd3, 4 samples of batch 2, 1 timed step "
                        "after 1, one thread (make test's)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.model, args.steps, args.skip, args.batch, args.samples, args.threads = "tiny-sd3", 1, 1, 2, 4, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    size, default_steps, _ = PRESETS[args.model]
    steps = args.steps or default_steps

    from unirl_core.domains.diffusion.warmup import WarmupData
    from unirl_core.models.logs import quiet_model_libraries

    quiet_model_libraries()
    with tempfile.TemporaryDirectory(prefix="warmup-gain-") as tmp:
        tmp = Path(tmp)
        params = build_model(args.model, tmp / "model")
        sources = make_data(tmp / "src", args.samples, size)
        precache = precache_config(tmp / "src", tmp / "cache", str(tmp / "model"), size, args.batch)
        started = time.perf_counter()
        run_task(precache, 0, 1)
        cached_in = time.perf_counter() - started
        config = load_recipe(
            "demo",
            [f"train.model.path={tmp / 'model'}", f"train.warmup.batch_size={args.batch}", "train.warmup.latent_key=latent",
             "train.warmup.text_key=prompt", f"train.output_dir={tmp / 'out'}"],
        ).train  # fmt: skip
        data = WarmupData(precache, args.batch, latent_key="latent", text_key="prompt", seed=config.warmup.seed)
        started = time.perf_counter()
        len(data)  # reads the whole cache into memory, as a warm-up round does before its first step
        loaded_in = time.perf_counter() - started
        results = [run(mode, config, data, sources, steps, args.skip) for mode in ("on the fly", "precached")]

    def count(n: int) -> str:
        return f"{n / 1e6:.1f} M" if n >= 1e5 else f"{n / 1e3:.0f} k"

    encoders = {k: v for k, v in params.items() if k != "transformer"}
    print(
        f"{args.model}: MMDiT {count(params['transformer'])} parameters (LoRA rank {config.model.lora.rank}), "
        f"encoders {', '.join(f'{k} {count(v)}' for k, v in encoders.items())}; {size} px, batch {args.batch}, "
        f"torch threads {torch.get_num_threads()}, {steps} timed steps after {args.skip}"
    )
    print(
        f"precache of {args.samples} samples: {cached_in:.1f} s (once); read into memory: {loaded_in:.2f} s (once per "
        "round)"
    )
    print(f"{'mode':<11} {'steps/s':>8} {'s/step':>8} {'median':>8} {'encode or read':>15}")
    for r in results:
        print(
            f"{r['mode']:<11} {r['steps_per_s']:>8.2f} {r['s_per_step']:>8.3f} {r['median']:>8.3f} "
            f"{r['input_share']:>15.0%}"
        )
    fly, cached = results
    gap = max(abs(a - b) for a, b in zip(fly["losses"], cached["losses"], strict=True))
    print(f"losses of the two modes agree to {gap:.1e} (same batches, same draws)")
    ratio = cached["steps_per_s"] / fly["steps_per_s"]
    bound = 1 / (1 - fly["input_share"])
    print(
        f"ratio precached / on the fly   {ratio:.2f}x  ({(ratio - 1):+.0%} steps/s; encoding is {fly['input_share']:.0%}"
        f" of an on-the-fly step: removing just that gives {bound:.2f}x; NeMo claims up to 1.60x)"
    )


if __name__ == "__main__":
    main()
