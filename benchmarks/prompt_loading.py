"""Prompt loading: unirl's normalized load against the bare computation (json.loads of every line).

Run: .venv/bin/python benchmarks/prompt_loading.py [--rows 200000] [--smoke]
Prints rows/s for both and the ratio (bare / ours): how much the schema checks, metadata folding and URI
resolution cost on top of parsing. `--smoke` (what `make test` runs): 100 rows, one pass each.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from unirl_core.data.prompts import load_prompts


def make_file(folder: Path, rows: int) -> Path:
    path = folder / "prompts.jsonl"
    with path.open("w") as f:
        for i in range(rows):
            row = {"prompt": f"a photo of object {i} on a table, studio light", "style": "photo", "score": i % 7}
            if i % 10 == 0:
                row["media_refs"] = [{"modality": "image", "role": "condition", "uri": f"frames/{i}.png"}]
            f.write(json.dumps(row) + "\n")
    return path


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--smoke", action="store_true", help="seconds: 100 rows, one pass each (make test's)")
    args = parser.parse_args()
    repeats = 1 if args.smoke else 3
    if args.smoke:
        args.rows = 100
    with tempfile.TemporaryDirectory() as tmp:
        path = make_file(Path(tmp), args.rows)
        bare = best_of(lambda: [json.loads(line) for line in path.read_text().splitlines() if line.strip()], repeats)
        ours = best_of(lambda: load_prompts(str(path)), repeats)
    print(f"rows               {args.rows}")
    print(f"bare json.loads    {args.rows / bare:12,.0f} rows/s")
    print(f"unirl load_prompts {args.rows / ours:12,.0f} rows/s")
    print(f"ratio bare/ours    {bare / ours:.2f} (1.00 = no overhead over parsing)")


if __name__ == "__main__":
    main()
