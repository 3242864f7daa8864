"""A JSONL file's non-blank lines by number, without holding them as Python strings.

BAGEL's vlm_sft reads its JSONL with `readlines()` in every DataLoader worker: a few hundred bytes of Python object
per line, per worker (1M lines: ~0.4 GB each). Here a local file is memory-mapped (the OS page cache is shared by
every worker) and a remote one is read once into a single bytes object; the index is two int64 arrays (16 bytes a
line). Lines are split on b"\\n" only, as JSON Lines defines them (`str.splitlines` would also split on the U+2028
a JSON string may hold raw); lines of only ASCII whitespace are dropped, as BAGEL's `if line.strip()` would.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from unirl_core.io import storage

_CHUNK = 16 << 20  # bytes scanned at a time: bounds the scan's temporary arrays
_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\n\r\x0b\x0c")] = True


def line_bounds(data: bytes | mmap.mmap, chunk: int = _CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the non-blank lines of `data`: line k is data[starts[k]:ends[k]], its newline excluded."""
    buf = np.frombuffer(data, dtype=np.uint8) if len(data) else np.zeros(0, dtype=np.uint8)
    newlines = [np.flatnonzero(buf[begin : begin + chunk] == 10) + begin for begin in range(0, len(buf), chunk)]
    ends = np.concatenate([*newlines, np.array([len(buf)], dtype=np.int64)])
    starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1] + 1])
    filled = starts < ends
    keep = np.zeros(len(starts), dtype=bool)
    keep[filled] = ~_SPACE[buf[starts[filled]]]  # a line whose first byte is not a space is not blank (nearly all)
    for line in np.flatnonzero(filled & ~keep):  # the rest are checked whole
        keep[line] = bool(bytes(buf[starts[line] : ends[line]]).strip(b" \t\n\r\x0b\x0c"))
    return starts[keep], ends[keep]


class JsonLines:
    """`lines[k]`: the k-th non-blank line of a JSONL file, as bytes (json.loads takes bytes, BOM included)."""

    def __init__(self, path: str):
        self._open(path)

    def __getstate__(self) -> dict:  # a DataLoader started by spawn/forkserver pickles its dataset: send the path
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self._open(state["path"])

    def _open(self, path: str) -> None:
        self.path = path
        if storage.is_url(path):
            self._data: bytes | mmap.mmap = storage.read_bytes(path)
        else:
            with open(path, "rb") as file:
                empty = os.fstat(file.fileno()).st_size == 0
                self._data = b"" if empty else mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self._starts, self._ends = line_bounds(self._data)

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, index: int) -> bytes:
        return bytes(self._data[int(self._starts[index]) : int(self._ends[index])])
