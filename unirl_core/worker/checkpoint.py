"""Checkpoints that commit atomically and resume exactly.

    <root>/step_00000012/.metadata, __<rank>_0.distcp   torch.distributed.checkpoint: trained weights + optimizer
    <root>/step_00000012/trainer_state.json             the commit record, written LAST (temporary name, rename)

A checkpoint exists only when its `trainer_state.json` exists: a kill during a write leaves a folder without it,
which `latest()` ignores and the next `save` removes. The commit record holds every other file's size and CRC-32
(`files`), checked before a resume or an export reads the data: a flipped byte or a truncated file is refused naming
the file, or, with `on_corrupt="previous"`, the damaged checkpoint is moved aside (`step_N.corrupt`, kept for a
look) and the previous committed one is used. Retention keeps the last `keep` (>= 2) committed checkpoints
and deletes older ones only after the new one committed. The trainer state holds the step, the data-source and
advantage-tracker state, the LR scheduler, every RNG state (torch, numpy, python; per rank), the config hash and the
world size, so a resumed run continues with exactly the next sample and the same random draws.

Named states on both sides, each with `state_dict()`/`load_state_dict()` (torchtitan's `CheckpointManager(states=...)`):
the controller's `CheckpointManager(states={"": progress, "source": ..., "tracker": ..., "warmup_data": ...})` puts
them in the commit record and `load()` restores them; each rank's `RankCheckpoint({"model", "optim", "ema"},
{"rng", "scheduler"})` writes its tensor states through `torch.distributed.checkpoint` (DCP, the same code for a
plain module in one process and FSDP2 shards across ranks, one `.distcp` per rank) and hands its JSON states to the
controller. With LoRA only the trainable parameters are stored.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import random
import re
import shutil
import zlib
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from unirl_core.errors import UserError
from unirl_core.io.storage import write_bytes_atomic

STATE_FILE = "trainer_state.json"
STEP_DIR = re.compile(r"^step_(\d{8})$")
ON_CORRUPT = ("fail", "previous")
BLOCK = 8 << 20

log = logging.getLogger("unirl.checkpoint")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used (corrupt, or from another config or world size), naming the file."""


# Settings that may change between a run and its resume: where and how it runs, not what it computes. (The
# world size is checked on its own, with its own message.)
RESUMABLE_CHANGES = {
    "output_dir", "ray", "steps_per_round", "checkpoint_every", "keep_checkpoints", "checkpoint", "eval_every_rounds",
    "eval_prompts", "eval", "tracking",
}  # fmt: skip


def file_digests(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative name: {"bytes": size, "crc32": "8 hex"}} of every file of a checkpoint folder but its commit
    record. CRC-32 (zlib): several GB/s, catches flipped bytes and truncation (not tampering: the folder is ours)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != STATE_FILE)
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "crc32": crc32(p)} for p in files}


def crc32(path: Path) -> str:
    """The CRC-32 of a file, read in blocks (memory stays flat), as 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def verify_files(folder: Path, record: dict[str, Any]) -> None:
    """Every file the commit record lists is there with its size and CRC-32; a CheckpointError names the first
    that is not. (Records from before checksums list no files: nothing to check.)"""
    expected = record.get("files")
    if not expected:
        return
    for name, want in expected.items():
        path = folder / name
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != want["bytes"]:
            problem = f"has {path.stat().st_size} bytes, {want['bytes']} were committed (truncated or rewritten)"
        else:
            got = crc32(path)
            problem = f"CRC-32 is {got}, {want['crc32']} was committed (damaged)" if got != want["crc32"] else ""
        if problem:
            raise CheckpointError(
                f"{path}: {problem}; restore the file, or resume from the previous checkpoint with "
                "train.checkpoint.on_corrupt=previous"
            )


def config_hash(config) -> str:
    """Digest of what must not change across a resume: the resolved train config without RESUMABLE_CHANGES."""
    return _digest(_hashed(config))


# Keys every `train.algorithm` section held, at these defaults, before each algorithm had its own config class
# (diffusion_nft's nft_beta and old_decay_*, flow_dppo's kl_threshold): checkpoints written then carry the hash of
# a dump with them, and resume under `legacy_config_hash`.
PRE_PLUGIN_ALGORITHM_KEYS = {"nft_beta": 1.0, "old_decay_rate": 0.001, "old_decay_start": 0, "old_decay_max": 0.5,
                             "kl_threshold": 1e-5}  # fmt: skip


def legacy_config_hash(config) -> str:
    """The hash the same recipe had before algorithms had their own config classes (same numbers, another dump)."""
    kept = _hashed(config)
    kept["algorithm"] = PRE_PLUGIN_ALGORITHM_KEYS | kept["algorithm"]
    return _digest(kept)


# Keys added to a section since checkpoints were first written, at the value that means what their absence meant:
# left out of the hash there, so a checkpoint written before them still resumes (set otherwise, they count).
ADDED_KEYS = {
    "reward": {"llm_judge": None, "video": {"frames": "first", "sample_frames": 4}, "video_judge": None},
    "sampling": {"num_frames": None, "fps": None},
    "model": {"experts": None},
    "algorithm": {"dynamic_sampling": False, "max_gen_batches": 10},
}


def _hashed(config) -> dict:
    kept = config.model_dump(mode="json", exclude=RESUMABLE_CHANGES & set(type(config).model_fields))
    for section, added in ADDED_KEYS.items():
        for key, absent in added.items():
            if key in kept.get(section, {}) and kept[section][key] == absent:
                kept[section].pop(key)
    for key in ("steps_per_round", "micro_batch_size"):  # how the warm-up runs, not what it computes
        kept.get("warmup", {}).pop(key, None)
    kept.get("fsdp", {}).pop("reshard_after_forward", None)  # how the ranks gather, not what they compute
    for remote in kept.get("reward", {}).get("remote", {}).values():  # an added key of every remote scorer
        if remote.get("videos") == "frames":
            remote.pop("videos")
    if kept.get("domain") == {"name": "diffusion"}:  # the default: hashed as before `train.domain` existed
        kept.pop("domain")
    return kept


def _digest(kept: dict) -> str:
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


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


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CheckpointManager:
    """Checkpoints under `root` (the last `keep` committed kept). `states`: named states whose `state_dict()`
    goes into the commit record under its name and comes back through `load_state_dict` on `load()` (the data
    cursor, the advantage tracker, ...); a state named `""` is stored flat (the trainer's own progress).
    `identity`: keys that must match on resume (config hash, world size), stored flat too; `accepted`: other values
    of an identity key a checkpoint may carry and still resume (an older hash of the same config). `on_corrupt`: a latest
    checkpoint whose files fail their checksums is an error ("fail"), or is moved aside for the previous one
    ("previous")."""

    def __init__(self, root: str | Path, keep: int = 2, states: Mapping[str, Stateful] | None = None,
                 identity: Mapping[str, Any] | None = None, on_corrupt: str = "fail",
                 accepted: Mapping[str, Collection[Any]] | None = None):  # fmt: skip
        if keep < 2:
            raise ValueError(f"keep={keep}: at least 2 checkpoints are kept, so a failed write never leaves none")
        if on_corrupt not in ON_CORRUPT:
            raise ValueError(f"on_corrupt={on_corrupt!r}: one of {ON_CORRUPT}")
        self.root, self.keep, self.on_corrupt = Path(root), keep, on_corrupt
        self.states, self.identity = dict(states or {}), dict(identity or {})
        self.accepted = {key: {value, *(accepted or {}).get(key, ())} for key, value in self.identity.items()}

    def save(self, step: int, write: Callable[[Path], dict[str, Any]]) -> Path:
        """Checkpoint `step`: an empty folder, the ranks' data through `write(folder)` (a collective; it returns
        what the record keeps of the ranks: weight names, RNG states, LR schedule), then the commit record with
        every named state and the identity, written last."""
        folder = self.prepare(step)
        record = {"step": step, **write(folder)}
        for name, state in self.states.items():
            record |= state.state_dict() if name == "" else {name: state.state_dict()}
        return self.commit(folder, record | self.identity)

    def load(self, folder: Path | None = None, states: bool = True) -> tuple[Path | None, dict[str, Any] | None]:
        """The latest committed checkpoint (or `folder`) and its record, checked against the identity and its files
        against their checksums (see `on_corrupt`); with `states`, every named state is restored from it.
        (None, None) when there is none."""
        folder = folder or self.latest()
        while folder is not None:
            record = self.read_record(folder, expect=self.identity, accepted=self.accepted)
            try:
                verify_files(folder, record)
                break
            except CheckpointError as exc:
                if self.on_corrupt == "fail":
                    raise
                aside = folder.with_name(f"{folder.name}.corrupt")
                shutil.rmtree(aside, ignore_errors=True)
                folder.rename(aside)
                log.warning("%s; moved aside to %s, resuming from the previous checkpoint", exc, aside.name)
                folder = self.latest()
        if folder is None:
            return None, None
        if states:
            self.restore(record)
        return folder, record

    def restore(self, record: dict[str, Any]) -> None:
        """Every named state from a commit record."""
        for name, state in self.states.items():
            state.load_state_dict(record if name == "" else record[name])

    def committed(self) -> list[Path]:
        """Committed checkpoint folders, oldest first."""
        if not self.root.is_dir():
            return []
        folders = [p for p in self.root.iterdir() if STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
        return sorted(folders, key=lambda p: p.name)

    def latest(self) -> Path | None:
        committed = self.committed()
        return committed[-1] if committed else None

    def folder(self, step: int) -> Path:
        return self.root / f"step_{step:08d}"

    def prepare(self, step: int) -> Path:
        """Before the ranks write step `step`: remove interrupted writes, create an empty folder (one process)."""
        folder = self.folder(step)
        self._remove_partial(keep=None)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    def commit(self, folder: Path, record: dict[str, Any]) -> Path:
        """One process, after every rank's `RankCheckpoint.save` returned: the commit record (with every file's size
        and checksum), then retention."""
        record = record | {"files": file_digests(folder)}
        write_bytes_atomic(str(folder / STATE_FILE), json.dumps(record, indent=1, sort_keys=True).encode())
        for old in self.committed()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return folder

    @staticmethod
    def read_record(folder: Path, expect: dict[str, Any] | None = None,
                    accepted: Mapping[str, Collection[Any]] | None = None) -> dict[str, Any]:  # fmt: skip
        """A checkpoint's trainer state; `expect`: keys (config_hash, world_size) that must match the stored ones
        (or be among `accepted`'s values of the key)."""
        state_path = folder / STATE_FILE
        try:
            record = json.loads(state_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{state_path}: unreadable trainer state ({exc})") from None
        for key, value in (expect or {}).items():
            if record.get(key) != value and record.get(key) not in (accepted or {}).get(key, ()):
                raise CheckpointError(
                    f"{state_path}: {key} is {record.get(key)!r} but this run has {value!r}; resume with the same "
                    f"{key}, or start a new output_dir"
                )
        return record

    @classmethod
    def verify(cls, folder: Path) -> dict[str, Any]:
        """A checkpoint's record, after checking its files against the recorded sizes and checksums."""
        record = cls.read_record(folder)
        verify_files(folder, record)
        return record

    def _remove_partial(self, keep: Path | None) -> None:
        """Folders from interrupted writes (no commit record)."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if STEP_DIR.match(path.name) and not (path / STATE_FILE).is_file() and path != keep:
                shutil.rmtree(path, ignore_errors=True)


class ModelState:
    """The trained module's weights (LoRA: the adapter's alone), FSDP2-sharded or not, as a DCP Stateful."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.module, options=_options())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.module, state, options=_options())


class OptimizerState:
    """An optimizer's state keyed by the module's parameter names (resharding-safe), as a DCP Stateful. Load into
    an optimizer before its first backward (a worker loads right after building): torch initializes a fresh
    optimizer's state as the load target only while no parameter has a gradient."""

    def __init__(self, module: torch.nn.Module, optimizer):
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.module, self.optimizer, options=_options())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.module, self.optimizer, state, options=_options())


class RNGState:
    """This process's torch, numpy and python RNG states (JSON)."""

    def state_dict(self) -> dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state)


class RankCheckpoint:
    """One rank's named states. `tensors` (model, optimizer, EMA) go through DCP into the step folder, one
    `.distcp` per rank, the same code for a plain module and FSDP2 shards; `records` (RNG, LR schedule) are JSON the
    rank hands the controller for the commit record. `tensors` must name the trained weights `model`."""

    def __init__(self, tensors: Mapping[str, Stateful], records: Mapping[str, Stateful] | None = None):
        assert "model" in tensors, "a rank checkpoint holds the trained weights as `model`"
        self.tensors, self.records = dict(tensors), dict(records or {})

    def save(self, folder: Path) -> dict[str, Any]:
        """Every rank (a collective): write the tensor states; returns the weight names and the record states."""
        import torch.distributed.checkpoint as dcp

        dcp.save(dict(self.tensors), checkpoint_id=str(folder))
        model_keys = sorted(self.tensors["model"].state_dict())
        return {"model_keys": model_keys, **{name: state.state_dict() for name, state in self.records.items()}}

    def load(self, folder: Path, records: dict[str, Any] | None = None, weights_only: bool = False) -> None:
        """Every rank (a collective): restore the tensor states from `folder` (`weights_only`: `model` alone: a
        new stage starts from the trained weights with its own optimizer), then each record state found in
        `records` (this rank's RNG, the LR schedule)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        stored = CheckpointManager.read_record(folder)["model_keys"]
        names = sorted(self.tensors["model"].state_dict())
        if names != stored:
            missing = sorted(set(stored) ^ set(names))[:5]
            raise CheckpointError(f"{folder}: the trained parameters differ from the checkpoint's (e.g. {missing})")
        states = {"model": self.tensors["model"]} if weights_only else dict(self.tensors)
        try:
            dcp.load(states, checkpoint_id=str(folder))
        except (CheckpointException, Exception) as exc:  # DCP's wrapper of per-rank failures is a BaseException
            files = sorted(p.name for p in folder.iterdir() if p.name != STATE_FILE)
            reason = str(exc).strip().splitlines()[-1][:300]
            raise CheckpointError(f"{folder}: cannot load checkpoint data {files}: {reason}") from None
        for name, state in self.records.items():
            if records and name in records:
                state.load_state_dict(records[name])
