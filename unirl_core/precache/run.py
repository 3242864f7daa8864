"""One precache task: its slice of source shards -> encoding shards `t{task}_r{rank}_{n}.tar`, resumable per shard.

Each output shard holds exactly `tar_chunk_size` samples (the task's last one fewer, with a `.INCOMPLETE` marker)
and is committed by `t{task}_r{rank}_{n}.json`, written after the tar: how many source samples were consumed up
to its end, its keys' skips, its hash, and the cache identity. A killed task resumes after its last committed shard
(not from the start of its slice); `t{task}_r{rank}.done.json` marks the task finished.

    members per sample (`<source tar>/<source key>` is the sample key, as NeMo names it):
      safetensors   <key>.safetensors   {encoding key: tensor} (text without padding when store_pad_tokens: false)
      npy           <key>.<encoding>    np.save bytes, one member per encoding (NeMo's pickle_encodings: false)
      nemo_pickle   <key>.pickle        pickled dict[str, ndarray] (NeMo's layout; readers need trusted)

Source samples with a member name that could escape a folder, or (unless `precache.trusted`) a pickle-like or
executable member, are skipped like corrupt ones (`unsafe_name: ...`, `unsafe_member: ...`; see members.py). A
failure while a shard is open (an encoder error, a full disk: StorageError naming the shard) removes its temporary.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import os
import pickle
from collections.abc import Callable, Iterator

import numpy as np
import torch
from safetensors.torch import save as safetensors_save
from torch.utils.data import DataLoader

from unirl_core.config.precache import EncodingSpec, PrecacheConfig
from unirl_core.errors import UserError
from unirl_core.ingest.videos import require_av
from unirl_core.io import storage
from unirl_core.io.tars import TarShardWriter
from unirl_core.models.dtypes import DTYPES
from unirl_core.precache.encoders import build_encoder, encoder_identity, run_encoder
from unirl_core.precache.source import SourceSamples, output_shard_name, source_shards, task_slice

logger = logging.getLogger(__name__)
INCOMPLETE = ".INCOMPLETE"


class PrecacheError(UserError, ValueError):
    """A precache that can never succeed as configured (bad encoder output, stale cache, bad config)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Encoders:
    """The configured encoders, built once per task, with the cache identity they produce."""

    def __init__(self, config: PrecacheConfig):
        _check_video_transform(config)
        self.config = config
        self.device, self.dtype = resolve_device(config.device), DTYPES[config.dtype]
        self.built = {spec.key: self._build(spec) for spec in config.encodings}
        self.identity = cache_identity(
            config, {k: encoder_identity(s.encoder_config.model_dump(), self.built[k]) for k, s in self._specs()}
        )

    def _specs(self):
        return [(spec.key, spec) for spec in self.config.encodings]

    def _build(self, spec: EncodingSpec):
        try:
            return build_encoder(spec.encoder_config.model_dump(), self.device, self.dtype)
        except (TypeError, OSError) as exc:
            raise PrecacheError(f"encodings[{spec.key}]: cannot build {spec.encoder_config.cls}: {exc}") from None

    @torch.inference_mode()
    def encode(self, batch: list[dict]) -> list[dict[str, np.ndarray]]:
        """Per sample, {encoding key: array at the configured precision}; errors name the samples."""
        per_sample: list[dict[str, np.ndarray]] = [{} for _ in batch]
        for spec in self.config.encodings:
            inputs = [sample["inputs"][spec.key] for sample in batch]
            if spec.modality in ("image", "video"):  # [B, 3, H, W] or [B, 3, F, H, W]
                inputs = torch.stack(inputs).to(self.device, self.dtype)
            output = run_encoder(self.built[spec.key], inputs)
            for i, array in enumerate(self._split(spec, output, batch)):
                per_sample[i][spec.key] = array
        return per_sample

    def _split(self, spec: EncodingSpec, output, batch: list[dict]) -> list[np.ndarray]:
        keys = [s["key"] for s in batch]
        mask = None
        if isinstance(output, tuple | list):
            output, mask = output[0], (output[1] if len(output) > 1 else None)
        if not spec.store_pad_tokens and mask is None:
            raise PrecacheError(
                f"encodings[{spec.key}]: store_pad_tokens is false but {spec.encoder_config.cls} returned no mask; "
                "it must return (encoded, mask), or set store_pad_tokens: true"
            )
        if not isinstance(output, torch.Tensor) or output.shape[0] != len(batch):
            shape = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            raise PrecacheError(
                f"encodings[{spec.key}]: the encoder returned {shape} for a batch of {len(batch)} ({keys[0]}...)"
            )
        if not torch.isfinite(output).all():
            bad = [keys[i] for i in range(len(batch)) if not torch.isfinite(output[i]).all()]
            raise PrecacheError(f"encodings[{spec.key}]: NaN/Inf in the encoder output for {bad}")
        target = torch.float16 if spec.precision == 16 else torch.float32
        output = output.to("cpu", target)
        if spec.store_pad_tokens:
            return [output[i].numpy() for i in range(len(batch))]
        mask = mask.to("cpu").bool()
        return [output[i][mask[i]].numpy() for i in range(len(batch))]


def _check_video_transform(config: PrecacheConfig) -> None:
    transform = config.video_transform
    missing = [f for f in ("num_frames", "fps", "width", "height") if getattr(transform, f) is None]
    if config.has_video:
        require_av()
    if config.has_video and missing:
        raise PrecacheError(
            f"precache.video_transform.{missing[0]} is empty and a video encoding needs it: set it, or set "
            f"train.sampling.{missing[0]} in the same recipe (empty video_transform fields are taken from there)"
        )


def cache_identity(config: PrecacheConfig, encoders: dict[str, dict] | None) -> dict:
    """What a cache holds: per encoding its spec (and, when built, the encoder's weights), the image transform
    (and the video transform, with a video encoding) and the output format. Readers compare it with what they are asked for."""
    specs = []
    for spec in config.encodings:
        entry = spec.model_dump(mode="json", exclude={"encoder_config"}) | {
            "encoder_config": spec.encoder_config.model_dump(mode="json")
        }
        if encoders is not None:
            entry["weights"] = encoders[spec.key]["weights"]
        specs.append(entry)
    identity = {
        "encodings": specs,
        "image_transform": config.image_transform.model_dump(mode="json"),
        "format": config.output_format,
    }
    if config.has_video:  # an image cache's identity is what it was before videos
        identity["video_transform"] = config.video_transform.model_dump(mode="json")
    return identity


def members_for(config: PrecacheConfig, arrays: dict[str, np.ndarray], originals: dict[str, bytes]) -> dict[str, bytes]:
    fmt = config.output_format
    if fmt == "safetensors":
        members = {
            "safetensors": safetensors_save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()})
        }
    elif fmt == "npy":
        members = {}
        for key, array in arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            members[key] = buffer.getvalue()
    else:  # nemo_pickle: NeMo's layout, an explicit opt-in
        members = {"pickle": pickle.dumps(arrays, protocol=4)}
    return {**originals, **members}


def run_task(
    config: PrecacheConfig, task: int, count: int, rank: int = 0, on_samples: Callable[[int], None] | None = None
) -> dict:
    """Precache task `task` of `count`; resumes after its last committed output shard. Returns the done record,
    with `encoded_now`: the samples this call encoded (the others were committed before)."""
    out = config.output_dir.rstrip("/")
    done_path = f"{out}/t{task}_r{rank}.done.json"
    shards = task_slice(source_shards(config.input_dir), task, count)
    encoders = Encoders(config)
    if storage.exists(done_path):
        done = json.loads(storage.read_text(done_path))
        _check_identity(done["identity"], encoders.identity, done_path)
        return {**done, "encoded_now": 0}
    storage.remove_temporaries(out, f"t{task}_r{rank}_")  # what a killed run of this task was writing
    committed = _committed(out, task, rank, encoders.identity)
    consumed = committed[-1]["source_consumed"] if committed else 0
    loader = DataLoader(
        SourceSamples(shards, config, start=consumed),
        batch_size=None,
        num_workers=config.dataloader_num_workers,
        prefetch_factor=4 if config.dataloader_num_workers else None,
        # forkserver: the caller (a Prefect task, a Ray worker) has threads, and forking a threaded process can
        # copy a held lock into the children
        multiprocessing_context="forkserver" if config.dataloader_num_workers else None,
        # a forkserver keeps the environment of its first use: give workers today's (credentials, endpoints)
        worker_init_fn=functools.partial(_adopt_environment, dict(os.environ)),
    )
    loop = _ShardLoop(config, encoders, task, rank, len(committed), consumed)
    records = list(committed) + list(loop.run(_batches(iter(loader), config.batch_size_per_GPU), on_samples))
    done = {
        "task": task,
        "task_count": count,
        "rank": rank,
        "source_shards": [storage.basename(s) for s in shards],
        "shards": [r["shard"] for r in records],
        "samples": sum(r["shard"]["nsamples"] for r in records),
        "source_samples": loop.consumed,
        "skipped": [s for r in records for s in r["skipped"]] + loop.skips,
        "identity": encoders.identity,
    }
    storage.write_bytes_atomic(done_path, json.dumps(done, indent=1, sort_keys=True).encode())
    return {**done, "encoded_now": sum(r["shard"]["nsamples"] for r in records[len(committed) :])}  # not recorded


def _adopt_environment(environment: dict[str, str], worker_id: int) -> None:
    os.environ.clear()
    os.environ.update(environment)


def _check_identity(recorded: dict, wanted: dict, where: str) -> None:
    if recorded != wanted:
        raise PrecacheError(
            f"{where}: cache built with {json.dumps(recorded, sort_keys=True)}, config wants "
            f"{json.dumps(wanted, sort_keys=True)}; use a new output_dir or delete this one to rebuild"
        )


def _committed(out: str, task: int, rank: int, identity: dict) -> list[dict]:
    records, number = [], 0
    while storage.exists(path := f"{out}/{output_shard_name(task, rank, number)[:-4]}.json"):
        record = json.loads(storage.read_text(path))
        _check_identity(record["identity"], identity, path)
        records.append(record)
        number += 1
    return records


def _batches(samples: Iterator[dict], size: int) -> Iterator[tuple[list[dict], list[dict]]]:
    """(samples to encode, skips) in source order, at most `size` samples to encode per batch."""
    batch, skips = [], []
    for sample in samples:
        if "skip" in sample:
            skips.append(sample)
        else:
            batch.append(sample)
        if len(batch) == size:
            yield batch, skips
            batch, skips = [], []
    if batch or skips:
        yield batch, skips


class _ShardLoop:
    """Writes encoded samples into output shards of `tar_chunk_size`, committing each with its source position.

    `consumed` is always a source position (sample number + 1), never a count of what happened to be processed:
    a skip that comes after the last written sample belongs to the next shard, so a resume neither loses nor
    repeats a sample."""

    def __init__(self, config, encoders, task, rank, number, consumed):
        self.config, self.encoders, self.task, self.rank = config, encoders, task, rank
        self.number, self.consumed, self.position = number, consumed, consumed
        self.out = config.output_dir.rstrip("/")
        self.writer, self.skips = None, []

    def run(self, batches, on_samples) -> Iterator[dict]:
        try:
            yield from self._run(batches, on_samples)
        except BaseException:  # a failed encoder, a full disk, a kill: the open shard's temporary goes too
            if self.writer is not None:
                self.writer.abort()
            raise

    def _run(self, batches, on_samples) -> Iterator[dict]:
        for batch, skips in batches:
            self.skips += [{"key": s["key"], "reason": s["skip"], "number": s["number"]} for s in skips]
            self.position = max([self.position] + [s["number"] + 1 for s in batch + skips])
            for sample, encoded in zip(batch, self.encoders.encode(batch) if batch else [], strict=True):
                if self.writer is None:
                    self.writer = TarShardWriter(f"{self.out}/{output_shard_name(self.task, self.rank, self.number)}")
                self.writer.write(sample["key"], members_for(self.config, encoded, sample["originals"]))
                if self.writer.nsamples == self.config.tar_chunk_size:
                    yield self._commit(sample["number"] + 1, complete=True)
            if on_samples:
                on_samples(len(batch) + len(skips))
        if self.writer is not None:
            storage.write_bytes_atomic(
                f"{self.out}/{output_shard_name(self.task, self.rank, self.number)}{INCOMPLETE}", b""
            )
            yield self._commit(self.position, complete=False)
        self.consumed = self.position  # trailing skips count as consumed, listed in the done record

    def _commit(self, consumed: int, complete: bool) -> dict:
        mine = [s for s in self.skips if s["number"] < consumed]
        self.skips = [s for s in self.skips if s["number"] >= consumed]
        record = _commit(
            self.out, self.writer, self.task, self.rank, self.number, consumed, mine, self.encoders.identity, complete
        )
        self.writer, self.number, self.consumed = None, self.number + 1, consumed
        return record


def _commit(out, writer, task, rank, number, consumed, skipped, identity, complete) -> dict:
    info = writer.commit()
    record = {
        "shard": {
            "name": info.name,
            "nsamples": info.nsamples,
            "filesize": info.filesize,
            "sha256": info.sha256,
            "md5": info.md5,
            "complete": complete,
        },
        "source_consumed": consumed,
        "skipped": skipped,
        "identity": identity,
    }
    path = f"{out}/{output_shard_name(task, rank, number)[:-4]}.json"
    storage.write_bytes_atomic(path, json.dumps(record, indent=1, sort_keys=True).encode())
    return record


def identity_digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
