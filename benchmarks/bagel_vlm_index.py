"""vlm_sft at scale: what a JSONL of N conversations costs each DataLoader worker, BAGEL's way and ours.

    .venv/bin/python benchmarks/bagel_vlm_index.py [--lines 1000000] [--world-size 2] [--workers 2]
    .venv/bin/python benchmarks/bagel_vlm_index.py --smoke    # seconds: 200 lines (make test's)

Writes an N-line captioning JSONL (~200 bytes a line) to a temporary folder, then in fresh subprocesses (so the
resident memory is that of one worker):
  readlines  BAGEL's reading: every non-blank line kept as a Python str (`readlines` + `strip`), per worker
  ours       `VLMDataset` for that file and layout: the memory-mapped line index, the sharding of the lines over
             ranks x workers, and a reader's `state()` (what every packed batch carries as `data_status`); under
             `target: unirl` (lines in a seeded permutation) and `target: bagel` (lines sorted by their text
             first, as BAGEL orders them: every line is read once at the start)
Printed: build seconds, private (anonymous) memory added (MB; a memory-mapped file's pages are the OS's shared,
reclaimable page cache, counted once for all workers), and the time of one `state()` call.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ANON = """
def anon_mb():  # private anonymous memory: a memory-mapped file's pages are the OS's shared, reclaimable cache
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) / 1e3
"""

READLINES = (
    ANON
    + """
import gc, json, sys, time
gc.collect(); before = anon_mb()
started = time.perf_counter()
with open(sys.argv[1], encoding="utf-8") as file:
    lines = [line for line in file.readlines() if line.strip()]
seconds = time.perf_counter() - started
gc.collect()
print(json.dumps({"build_s": seconds, "anon_mb": anon_mb() - before, "lines": len(lines)}))
"""
)

OURS = (
    ANON
    + """
import gc, json, sys, time
from unirl_core.data.bagel.config import DatasetInfo, GroupConfig, TransformArgs
from unirl_core.data.bagel.datasets import Layout, VLMDataset
path, world, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
group = GroupConfig(dataset_names=["bench"], weight=1.0,
                    image_transform_args=TransformArgs(image_stride=14, max_image_size=224, min_image_size=112))
gc.collect(); before = anon_mb()
started = time.perf_counter()
data = VLMDataset(group, [DatasetInfo(data_dir=str(sys.argv[1]) + ".images", jsonl_path=path)],
                  encode=lambda text: [0] * len(text.split()), layout=Layout(world_size=world, num_workers=workers),
                  target=sys.argv[4])
seconds = time.perf_counter() - started
gc.collect(); anon = anon_mb() - before
reader = data.reader(workers - 1)
started = time.perf_counter()
for _ in range(20):
    reader.state()
state_ms = (time.perf_counter() - started) / 20 * 1000
print(json.dumps({"build_s": seconds, "anon_mb": anon, "lines": len(data.units), "state_ms": state_ms}))
"""
)


def write_jsonl(path: Path, lines: int) -> None:
    with open(path, "w", encoding="utf-8") as file:
        for index in range(lines):
            record = {"image": f"{index % 1000:04d}.png", "conversations": [
                {"from": "human", "value": "<image>\nDescribe this picture in one sentence."},
                {"from": "gpt", "value": f"A red square, number {index}, on a white background."}]}  # fmt: skip
            file.write(json.dumps(record) + "\n")


def measure(script: str, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="seconds: 200 lines (make test's)")
    args = parser.parse_args()
    if args.smoke:
        args.lines = 200
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.jsonl"
        write_jsonl(path, args.lines)
        size_mb = path.stat().st_size / 1e6
        bagel = measure(READLINES, str(path))
        ours = {target: measure(OURS, str(path), str(args.world_size), str(args.workers), target)
                for target in ("unirl", "bagel")}  # fmt: skip
    print(f"{args.lines} lines ({size_mb:.0f} MB), {args.world_size} ranks x {args.workers} workers; per worker:")
    print(f"readlines (BAGEL)     build {bagel['build_s']:6.2f} s   +private {bagel['anon_mb']:7.0f} MB")
    for target, row in ours.items():  # a small file's lines may add no measurable private memory: no ratio then
        ratio = f"{row['anon_mb'] / bagel['anon_mb']:.3f}" if bagel["anon_mb"] > 0 else "-"
        print(
            f"ours, target {target:5s}  build {row['build_s']:6.2f} s   +private {row['anon_mb']:7.0f} MB   "
            f"state() {row['state_ms']:.3f} ms   memory / readlines {ratio}"
        )


if __name__ == "__main__":
    main()
