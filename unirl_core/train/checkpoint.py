"""Checkpoints that commit atomically and resume exactly.

    <root>/step_00000012/.metadata, __<rank>_0.distcp   torch.distributed.checkpoint: trained weights + optimizer
    <root>/step_00000012/trainer_state.json             the commit record, written LAST (temporary name, rename)

A checkpoint exists only when its `trainer_state.json` exists: a kill during a write leaves a folder without it,
which `latest()` ignores and the next `save` removes. Retention keeps the last `keep` (>= 2) committed checkpoints
and deletes older ones only after the new one committed. The trainer state holds the step, the data-source and
advantage-tracker state, the LR scheduler, every RNG state (torch, numpy, python; per rank), the config hash and the
world size, so a resumed run continues with exactly the next sample and the same random draws.

Weights and optimizer go through `torch.distributed.checkpoint` (DCP) with `get_state_dict`/`set_state_dict`, so
the same code saves a plain module in one process and an FSDP2-sharded one across ranks (one `.distcp` per rank).
With LoRA only the trainable parameters are stored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from unirl_core.io.storage import write_bytes_atomic

STATE_FILE = "trainer_state.json"
STEP_DIR = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (corrupt, or from another config or world size), naming the file."""


def config_hash(config) -> str:
    """Digest of what must not change across a resume (the resolved train config)."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]


def rng_state() -> dict[str, Any]:
    """This process's RNG states, JSON-serializable."""
    numpy_state = np.random.get_state()
    return {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "numpy": [numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # LoRA: only trainable parameters are saved; `strict` is checked by `_check_keys` instead
    return StateDictOptions(ignore_frozen_params=True, strict=False)


class CheckpointManager:
    def __init__(self, root: str | Path, keep: int = 2):
        if keep < 2:
            raise ValueError(f"keep={keep}: at least 2 checkpoints are kept, so a failed write never leaves none")
        self.root, self.keep = Path(root), keep

    def committed(self) -> list[Path]:
        """Committed checkpoint folders, oldest first."""
        if not self.root.is_dir():
            return []
        folders = [p for p in self.root.iterdir() if STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
        return sorted(folders, key=lambda p: p.name)

    def latest(self) -> Path | None:
        committed = self.committed()
        return committed[-1] if committed else None

    def save(self, step: int, module: torch.nn.Module, optimizer, trainer_state: dict[str, Any]) -> Path:
        """Write checkpoint `step`: DCP data first, then the commit record, then retention."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        folder = self.root / f"step_{step:08d}"
        rank0 = not dist.is_initialized() or dist.get_rank() == 0
        if rank0:
            self._remove_partial(keep=None)
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        if dist.is_initialized():
            dist.barrier()
        model_state, optim_state = get_state_dict(module, optimizer, options=_options())
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))
        if dist.is_initialized():
            dist.barrier()
        if rank0:
            record = {"step": step, "model_keys": sorted(model_state), **trainer_state}
            write_bytes_atomic(str(folder / STATE_FILE), json.dumps(record, indent=1, sort_keys=True).encode())
            for old in self.committed()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        return folder

    def load(
        self, folder: Path, module: torch.nn.Module, optimizer, expect: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Restore weights and optimizer from `folder`; returns its trainer state. `expect`: keys (config_hash,
        world_size) that must match the stored values."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        state_path = folder / STATE_FILE
        try:
            record = json.loads(state_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{state_path}: unreadable trainer state ({exc})") from None
        for key, value in (expect or {}).items():
            if record.get(key) != value:
                raise CheckpointError(
                    f"{state_path}: {key} is {record.get(key)!r} but this run has {value!r}; resume with the same "
                    f"{key}, or start a new output_dir"
                )
        model_state, optim_state = get_state_dict(module, optimizer, options=_options())
        if sorted(model_state) != record["model_keys"]:
            missing = sorted(set(record["model_keys"]) ^ set(model_state))[:5]
            raise CheckpointError(f"{folder}: the trained parameters differ from the checkpoint's (e.g. {missing})")
        state = {"model": model_state, "optim": optim_state}
        try:
            dcp.load(state, checkpoint_id=str(folder))
        except (CheckpointException, Exception) as exc:  # DCP's wrapper of per-rank failures is a BaseException
            files = sorted(p.name for p in folder.iterdir() if p.name != STATE_FILE)
            reason = str(exc).strip().splitlines()[-1][:300]
            raise CheckpointError(f"{folder}: cannot load checkpoint data {files}: {reason}") from None
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=_options())  # fmt: skip
        return record

    def _remove_partial(self, keep: Path | None) -> None:
        """Folders from interrupted writes (no commit record)."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if STEP_DIR.match(path.name) and not (path / STATE_FILE).is_file() and path != keep:
                shutil.rmtree(path, ignore_errors=True)
