"""BAGEL packing: packed samples/s vs bare iteration of the same datasets, and the mean fill ratio of the packs.

    .venv/bin/python benchmarks/bagel_packing.py [--scale demo|bagel] [--attention masks|splits] [--packs N] [--rows N]
    .venv/bin/python benchmarks/bagel_packing.py --smoke      # seconds: 12 t2i rows, 2 packs, 1 run (make test's)

A demo mixture (t2i parquet, edit parquet, VLM JSONL + images; `unirl_core/data/bagel/demo.py`) is written to a
temporary folder. `packed` runs the Packer for --packs packs (group draws, CFG dropout, patchify, positions,
timesteps, per-sample attention masks, padded images). `bare` then pulls exactly as many samples from each group's
reader as the packer packed (decode, transform, tokenize: the dataset's own work). The ratio is packed samples/s over
bare samples/s (1.0: packing is free), medians of --repeats alternating runs. The goal for the fill ratio is >= 0.9 of the target.

  demo   the demo's settings: images 128-256 px (VAE) / 112-224 px (ViT), packs of 4096 tokens (hard cap 4608)
  bagel  BAGEL's defaults: VAE images 512-1024 px, ViT 224-980 px, packs of 32768 tokens (hard cap 36864)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter

from unirl_core.data.bagel.config import TransformArgs, load_mixture
from unirl_core.data.bagel.datasets import Layout
from unirl_core.data.bagel.demo import write_demo_mixture
from unirl_core.data.bagel.loader import open_groups, open_packer
from unirl_core.data.bagel.tokenizer import load_tokenizer

# 1024 px VAE images are 64 x 64 latents: the released BAGEL-7B-MoT's max_latent_size (BAGEL's default is 32)
BAGEL_PACKING = {"expected_num_tokens": 32768, "max_num_tokens": 36864, "max_num_tokens_per_sample": 16384,
                 "prefer_buffer_before": 16384, "max_buffer_size": 50, "max_latent_size": 64}  # fmt: skip


def bagel_scale(mixture) -> None:
    vae = TransformArgs(image_stride=16, max_image_size=1024, min_image_size=512)
    mixture.groups["t2i_pretrain"].image_transform_args = vae
    mixture.groups["unified_edit"].image_transform_args = vae
    mixture.groups["unified_edit"].vit_image_transform_args = TransformArgs(
        image_stride=14, max_image_size=518, min_image_size=224
    )
    mixture.groups["vlm_sft"].image_transform_args = TransformArgs(
        image_stride=14, max_image_size=980, min_image_size=378, max_pixels=2_007_040
    )
    mixture.packing = BAGEL_PACKING


def run_packed(mixture, packs: int, tokenizer) -> tuple[float, Counter, list[float]]:
    packer = open_packer(mixture, Layout(), tokenizer=tokenizer)
    fills, started = [], time.perf_counter()
    for _ in range(packs):
        batch = next(packer)
        fills.append(batch["sequence_length"] / packer.config.expected_num_tokens)
    seconds = time.perf_counter() - started
    return seconds, Counter(packer.stats.num_samples), fills


def run_bare(mixture, counts: Counter, tokenizer) -> float:
    datasets, _ = open_groups(mixture, Layout(), tokenizer)
    readers = {kind: data.reader() for kind, data in datasets.items()}
    started = time.perf_counter()
    for kind, count in counts.items():
        for _ in range(count):
            next(readers[kind])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=["demo", "bagel"], default="demo")
    parser.add_argument("--packs", type=int, default=40)
    parser.add_argument("--rows", type=int, default=192, help="t2i rows (edit: rows/3, vlm: rows/2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", choices=["masks", "splits"], default="masks", help="dense masks or split lens")
    parser.add_argument("--smoke", action="store_true", help="seconds: 12 t2i rows, 2 packs, 1 run (make test's)")
    args = parser.parse_args()
    if args.smoke:
        args.rows, args.packs, args.repeats = 12, 2, 1
    with tempfile.TemporaryDirectory() as folder:
        path = write_demo_mixture(folder, t2i_rows=args.rows, edit_rows=args.rows // 3, vlm_rows=args.rows // 2)
        mixture = load_mixture(path)
        if args.scale == "bagel":
            bagel_scale(mixture)
        mixture.packing = {**mixture.packing, "attention": args.attention}
        tokenizer = load_tokenizer(mixture.tokenizer)
        run_packed(mixture, 2, tokenizer)  # warm caches and imports
        packed_runs, bare_runs = [], []
        for _ in range(args.repeats):  # alternate, so both see the same warm caches; median of each
            packed_s, counts, fills = run_packed(mixture, args.packs, tokenizer)
            packed_runs.append(packed_s)
            bare_runs.append(run_bare(mixture, counts, tokenizer))
        packed_s, bare_s = statistics.median(packed_runs), statistics.median(bare_runs)
    samples = sum(counts.values())
    packed_rate, bare_rate = samples / packed_s, samples / bare_s
    print(f"scale {args.scale}, attention {args.attention}: {args.packs} packs, {samples} samples ({dict(counts)})")
    print(f"bare iteration   {bare_rate:8.1f} samples/s ({bare_s:.2f} s)")
    print(f"packed           {packed_rate:8.1f} samples/s ({packed_s:.2f} s)")
    print(f"packed / bare    {packed_rate / bare_rate:8.3f}")
    print(f"fill ratio       mean {sum(fills) / len(fills):.3f}, min {min(fills):.3f}, max {max(fills):.3f} "
          f"(goal mean >= 0.9)")  # fmt: skip


if __name__ == "__main__":
    main()
