"""Warm-up data at scale: the controller's private memory for a precached cache of N samples, and the time to
assemble a batch, with `WarmupData` reading batches by offset (index only in memory).

    .venv/bin/python benchmarks/warmup_data_memory.py [--samples 256] [--batch 8] [--cache DIR] [--code DIR]
    .venv/bin/python benchmarks/warmup_data_memory.py --smoke    # seconds: tiny-sd3 at 32 px, 4 samples (make test's)

The cache is a real precache (float32 `AutoencoderKLEncoder` latents and `PipelinePromptEncoder` conditioning) of
the `sized-sd3` model of `warmup_precache_gain.py` at 256 px (16 latent channels, T5 256 wide x 256 tokens):
~0.5 MB a sample on disk. It is built once into --cache (reused when it exists). A fresh subprocess then builds
`WarmupData`, indexes the cache (the first batch) and times 20 more batches; printed: private (anonymous) memory
held by the data (measured after glibc's `malloc_trim`, so freed heap pages do not count), the seconds of the first batch (the index pass) and of later batches. --code runs the
measurement against another checkout (e.g. a worktree of an older commit) to compare implementations.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MEASURE = """
import ctypes, gc, json, sys, time
from diffusers import AutoencoderKL  # imported before measuring: the data's memory, not the libraries'
import safetensors.torch
from unirl_core.config.precache import PrecacheConfig
from unirl_core.domains.diffusion.warmup import WarmupData

def anon_mb():  # private anonymous memory of this process, after returning freed heap pages to the OS
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1e3

config = PrecacheConfig.model_validate_json(open(sys.argv[1]).read())
batch = int(sys.argv[2])
data = WarmupData(config, batch, latent_key="latent", text_key="prompt")
gc.collect(); before = anon_mb()
started = time.perf_counter(); first = data.next_batch(); first_s = time.perf_counter() - started
started = time.perf_counter()
for _ in range(20):
    data.next_batch()
later_s = (time.perf_counter() - started) / 20
gc.collect()
print(json.dumps({"samples": len(data), "anon_mb": anon_mb() - before, "first_s": first_s, "batch_s": later_s,
                  "latents": list(first["latents"].shape), "embeds": list(first["cond"]["embeds"].shape)}))
"""


def build_cache(folder: Path, samples: int, model: str = "sized-sd3") -> Path:
    """The precache of `samples` samples of `model` (warmup_precache_gain.py's presets) under `folder` (kept); returns
    its config file."""
    from warmup_precache_gain import PRESETS, build_model, make_data, precache_config

    from unirl_core.precache.run import run_task

    config_file = folder / "precache.json"
    if config_file.is_file():
        return config_file
    size = PRESETS[model][0]
    build_model(model, folder / "model")
    make_data(folder / "src", samples, size)
    config = precache_config(folder / "src", folder / "out", str(folder / "model"), size, batch=8)
    run_task(config, 0, 1)
    config_file.write_text(config.model_dump_json())
    return config_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cache", type=Path, default=None, help="keep the cache here (default: a temporary folder)")
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose WarmupData is measured")
    parser.add_argument("--smoke", action="store_true", help="seconds: the tiny-sd3 model at 32 px, 4 samples, "
                        "batch 2 (make test's)")  # fmt: skip
    args = parser.parse_args()
    if args.smoke:
        args.samples, args.batch = 4, 2
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.cache or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        config_file = build_cache(folder, args.samples, "tiny-sd3" if args.smoke else "sized-sd3")
        env = {**os.environ, "PYTHONPATH": str(args.code.resolve())}
        result = subprocess.run([sys.executable, "-c", MEASURE, str(config_file), str(args.batch)], env=env,
                                cwd=args.code, capture_output=True, text=True, check=True)  # fmt: skip
        measured = json.loads(result.stdout.strip().splitlines()[-1])
    on_disk = sum(p.stat().st_size for p in (folder / "out").glob("*.tar")) / 1e6 if args.cache else None
    print(f"{measured['samples']} samples, batch {args.batch} (latents {measured['latents']}, "
          f"embeds {measured['embeds']})" + (f", {on_disk:.0f} MB of shards" if on_disk else ""))  # fmt: skip
    print(f"private memory added {measured['anon_mb']:8.1f} MB")
    print(f"first batch (index) {measured['first_s']:8.2f} s")
    print(f"later batches       {measured['batch_s'] * 1000:8.1f} ms per batch")


if __name__ == "__main__":
    main()
