"""Files across data-parallel ranks and DataLoader workers: every file exactly once, no silent remainder.

BAGEL (`DistributedIterableDataset.set_epoch` / `get_data_paths_per_worker`) sorts the unit list, shuffles it with
`random.Random(seed)` (its trainer's `data_seed`, 42 by default), gives each rank a contiguous block and each worker
a contiguous block of its rank's units, walks a DataLoader worker's block backwards, and drops the remainder
silently. `order="bagel"` does the same: the same seed gives BAGEL's order whenever the units divide evenly.
`order="unirl"` shuffles with a numpy permutation and walks forwards. Both spread the remainder (the first
`len % parts` blocks get one unit more) instead of dropping it, and fewer units than ranks x workers is an error
naming the numbers.
Resume state is valid only for the same world size, worker count, seed and file list: `check_resume` refuses
anything else.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from unirl_core.data.resume import describe_changes
from unirl_core.errors import UserError


class ShardingError(UserError, ValueError):
    """A file list that cannot feed every rank and worker, or a resume state from another layout."""


def _blocks(items: list, parts: int) -> list[list]:
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def assign_files(
    files: list, world_size: int, num_workers: int, seed: int, unit: str = "files", order: str = "unirl",
    sort_key: Callable[[Any], Any] | None = None,
) -> list[list[list]]:  # fmt: skip
    """`assigned[rank][worker]`: that worker's files, in the seeded order; every file exactly once. Items may be any
    sortable values (paths, (path, row group) pairs, line numbers); `unit` names them in the error. `order`: "bagel"
    or "unirl" (module docstring); `sort_key`: what BAGEL sorts a unit by, when not the unit itself (vlm_sft: the
    line's text)."""
    if world_size < 1 or num_workers < 1:
        raise ShardingError(f"world_size={world_size} and num_workers={num_workers} must be at least 1")
    parts = world_size * max(1, num_workers)
    if len(files) < parts:
        raise ShardingError(
            f"{len(files)} {unit} cannot feed {world_size} ranks x {num_workers} workers = {parts} readers (each needs "
            f"at least one of the {unit}): split the data into more files (or row groups), or use fewer ranks or workers"
        )
    if order == "bagel":
        shuffled = sorted(files.tolist() if isinstance(files, np.ndarray) else files, key=sort_key)
        random.Random(seed).shuffle(shuffled)
        if isinstance(files, np.ndarray):  # integer units stay one array, not a Python int each
            shuffled = np.asarray(shuffled, dtype=np.int64)
        return [
            [block[::-1] for block in _blocks(rank_files, num_workers)] for rank_files in _blocks(shuffled, world_size)
        ]
    order = np.random.default_rng(seed).permutation(len(files))
    if isinstance(files, np.ndarray):  # integer units (JSONL lines): no Python object per unit
        shuffled = np.sort(files)[order]
    else:
        ordered = sorted(files)
        shuffled = [ordered[i] for i in order]
    return [_blocks(rank_files, num_workers) for rank_files in _blocks(shuffled, world_size)]


def layout_identity(
    files: list | np.ndarray, world_size: int, num_workers: int, seed: int, order: str = "unirl"
) -> dict[str, Any]:
    """What a resume state must match. Hashes every unit: compute it once per dataset, not per state."""
    if isinstance(files, np.ndarray):
        digest = hashlib.sha256(np.sort(files).astype("<i8").tobytes()).hexdigest()[:16]
    else:
        digest = hashlib.sha256(json.dumps(sorted(files)).encode()).hexdigest()[:16]
    return {"world_size": world_size, "num_workers": num_workers, "seed": seed, "order": order, "files_sha256": digest}


def check_resume(
    state: dict[str, Any], files: list, world_size: int, num_workers: int, seed: int, order: str = "unirl"
) -> None:
    """Refuse a resume state saved with another world size, worker count, seed, order or file list, naming each."""
    check_identity(state, layout_identity(files, world_size, num_workers, seed, order))


def check_identity(state: dict[str, Any], identity: dict[str, Any]) -> None:
    """`check_resume` against an identity already computed (`layout_identity`)."""
    details = describe_changes({"order": "unirl"} | state, identity)  # states from before `order`: unirl's
    if details:
        hint = ""
        if "order" in details:
            hint = " (a run started before BAGEL data had `target:` used this project's order: set `target: unirl`)"
        raise ShardingError(f"the data resume state was saved with another layout ({details}){hint}; resume with "
                            "the original layout or start without the state")  # fmt: skip
