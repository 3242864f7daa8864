"""`<output_dir>/metrics.jsonl`: one JSON row per step (the step, its stage and round, its metrics), exactly once
across kills and resumes: rows past the resumed checkpoint are dropped before their steps run again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unirl_core.io.storage import write_bytes_atomic

METRICS_FILE = "metrics.jsonl"


class MetricsFile:
    def __init__(self, out: Path):
        self.path = out / METRICS_FILE

    def drop_rows_from(self, step: int) -> None:
        """Rewrite the file (atomically) without the rows of `step` and later, and without a torn last line."""
        if not self.path.is_file():
            return
        lines = self.path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if line.endswith("\n") and json.loads(line)["step"] < step]
        if len(kept) != len(lines):
            write_bytes_atomic(str(self.path), "".join(kept).encode())

    def append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
