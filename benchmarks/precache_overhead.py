"""Precache overhead: the full precache (read shards, decode, transform, encode, write) vs the bare encoder loop.

    .venv/bin/python benchmarks/precache_overhead.py [--samples 48] [--batch 4] [--size 256] [--workers 1]
    .venv/bin/python benchmarks/precache_overhead.py --smoke   # seconds: 4 samples, 32 px, a tiny VAE (make test's)

The encoder is an SD-sized AutoencoderKL (diffusers' default SD 1.x VAE config, random weights, about 84 M
parameters), built from config and saved, then loaded the way precache loads any pretrained folder. The bare loop
runs the same encoder on the same already-decoded, already-transformed tensors. Goal: precache >= 0.9x the bare loop.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from unirl_core.config.precache import PrecacheConfig  # noqa: E402
from unirl_core.io.tars import TarShardWriter, iter_samples  # noqa: E402
from unirl_core.precache.encoders import build_encoder, run_encoder  # noqa: E402
from unirl_core.precache.run import run_task  # noqa: E402
from unirl_core.precache.source import image_transform  # noqa: E402

SD_CHANNELS = (128, 256, 512, 512)  # SD 1.x's VAE; the smoke's: (8, 8, 16, 16), the same 4 blocks and 8x downsampling


def sd_vae(folder: Path, channels: tuple[int, ...] = SD_CHANNELS) -> str:
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=channels,
        layers_per_block=2,
        latent_channels=4,
        norm_num_groups=min(32, channels[0]),
        sample_size=512,
    )
    vae.save_pretrained(folder)
    return str(folder)


def make_shards(folder: Path, samples: int, per_shard: int = 16) -> None:
    rng = np.random.default_rng(0)
    for shard in range(0, samples, per_shard):
        with TarShardWriter(str(folder / f"{shard // per_shard:05d}.tar")) as writer:
            for i in range(shard, min(samples, shard + per_shard)):
                pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
                out = io.BytesIO()
                Image.fromarray(pixels).save(out, "JPEG", quality=90)
                writer.write(f"{i:09d}", {"jpg": out.getvalue(), "txt": f"sample {i}".encode()})
            writer.commit()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="seconds: 4 samples, 32 px, a tiny VAE (make test's)")
    args = parser.parse_args()
    if args.smoke:
        args.samples, args.batch, args.size = 4, 2, 32
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = sd_vae(tmp / "vae", (8, 8, 16, 16) if args.smoke else SD_CHANNELS)
        make_shards(tmp / "shards", args.samples)
        config = PrecacheConfig.model_validate(
            {
                "input_dir": str(tmp / "shards"),
                "output_dir": str(tmp / "out"),
                "batch_size_per_GPU": args.batch,
                "dataloader_num_workers": args.workers,
                "tar_chunk_size": 16,
                "device": "cpu",
                "image_transform": {"size": args.size},
                "encodings": [
                    {"modality": "image", "extension": "jpg", "key": "vae", "precision": 16,
                     "encoder_config": {"cls": "unirl_core.precache.encoders.AutoencoderKLEncoder", "pretrained": model, "subfolder": None}},
                ],
            }
        )  # fmt: skip
        encoder = build_encoder(config.encodings[0].encoder_config.model_dump(), torch.device("cpu"), torch.float32)
        params = sum(p.numel() for p in encoder.parameters())
        tensors = [
            image_transform(Image.open(io.BytesIO(m["jpg"])), config.image_transform)
            for path in sorted((tmp / "shards").glob("*.tar"))
            for _, m in iter_samples(str(path))
        ]
        with torch.inference_mode():
            run_encoder(encoder, torch.stack(tensors[: args.batch]))  # warm-up, as precache's first batch is
            start = time.perf_counter()
            for i in range(0, len(tensors), args.batch):
                run_encoder(encoder, torch.stack(tensors[i : i + args.batch])).to(torch.float16).numpy()
            bare = time.perf_counter() - start
        del encoder
        start = time.perf_counter()
        done = run_task(config, 0, 1)
        full = time.perf_counter() - start
    rate_bare, rate_full = args.samples / bare, done["samples"] / full
    print(f"encoder: AutoencoderKL, {params / 1e6:.1f} M parameters, {args.size} px, batch {args.batch}, cpu")
    print(f"bare encoder loop   {rate_bare:6.2f} samples/s ({bare:.1f} s)")
    print(
        f"full precache       {rate_full:6.2f} samples/s ({full:.1f} s incl. loading the encoder, {args.workers} worker(s))"
    )
    print(f"ratio precache / bare   {rate_full / rate_bare:.2f}  (goal >= 0.9)")


if __name__ == "__main__":
    main()
