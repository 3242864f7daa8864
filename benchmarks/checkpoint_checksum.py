"""What the per-file checksums of a checkpoint's commit record cost, next to writing the checkpoint.

    .venv/bin/python benchmarks/checkpoint_checksum.py [--gb 1.0]
    .venv/bin/python benchmarks/checkpoint_checksum.py --smoke     # seconds: 4 tensors of 64 KB (make test's)

Saves a state dict of `--gb` GB of float32 tensors with torch.distributed.checkpoint (one process, as a one-rank
training run does) into a temporary folder, then times `file_digests` (what `commit` adds: size + CRC-32 of every
file, read back from the page cache) and `verify_files` (what a resume or an export adds before DCP reads the data),
and the DCP load itself for comparison. Printed side by side, with the ratio to the save.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from unirl_core.worker.checkpoint import file_digests, verify_files


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--smoke", action="store_true", help="seconds: 4 tensors of 64 KB (make test's)")
    args = parser.parse_args()
    per_tensor = 1 << 14 if args.smoke else 1 << 22  # float32: 64 KB, 16 MB
    count = 4 if args.smoke else max(1, round(args.gb * 1e9 / (4 * per_tensor)))
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(per_tensor, generator=generator) for i in range(count)}
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        folder = Path(tmp) / "step_00000000"
        save_s, _ = timed(lambda: dcp.save(state, checkpoint_id=str(folder)))
        size = sum(p.stat().st_size for p in folder.iterdir())
        digest_s, files = timed(lambda: file_digests(folder))
        verify_s, _ = timed(lambda: verify_files(folder, {"files": files}))
        target = {k: torch.empty_like(v) for k, v in state.items()}
        load_s, _ = timed(lambda: dcp.load(target, checkpoint_id=str(folder)))
    print(f"checkpoint: {size / 1e9:.3g} GB in {len(files)} files")
    print(f"{'step':<28}{'seconds':>9}{'GB/s':>8}{'x save':>9}")
    for name, seconds in [("dcp.save", save_s), ("commit: file_digests", digest_s),
                          ("resume: verify_files", verify_s), ("dcp.load", load_s)]:  # fmt: skip
        print(f"{name:<28}{seconds:>9.2f}{size / 1e9 / seconds:>8.2f}{seconds / save_s:>9.2f}")


if __name__ == "__main__":
    main()
