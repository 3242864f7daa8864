"""Reading source shards for precaching: task slices (NeMo's rule) and a decoding DataLoader dataset.

Task `t` of `T` takes the contiguous slice `files[t*N//T:(t+1)*N//T]` of the SORTED shard list. The dataset yields
samples in source order even with several DataLoader workers: worker w decodes samples w, w+W, w+2W, ... and the
DataLoader takes one from each worker in turn, so the output order (and the output bytes) never depend on the
worker count. A sample that cannot be decoded is yielded as a skip (counted and listed, never replaced), and so is
one with a member name that could escape a folder or a pickle-like/executable member (`members.py`). A video
member gives `num_frames` frames by `video_frames.py`'s rule; a clip that cannot (too short, damaged) is a skip
counted under its reason (`too_short: mp4: ...`).
"""

from __future__ import annotations

import io
import re

import fsspec
import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from unirl_core.config.precache import ImageTransformConfig, PrecacheConfig
from unirl_core.ingest.images import SkipSample
from unirl_core.io import storage
from unirl_core.io.tars import iter_samples
from unirl_core.precache.members import unsafe_sample_reason
from unirl_core.precache.video_frames import video_transform


def source_shards(input_dir: str) -> list[str]:
    """Sorted `*.tar` files of the source folder (local or URL)."""
    fs, path = fsspec.core.url_to_fs(input_dir)
    if not fs.exists(path):
        raise ValueError(f"precache.input_dir {input_dir} does not exist; run ingest first or set input_dir")
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False) if p.endswith(".tar"))
    if not names:
        raise ValueError(f"precache.input_dir {input_dir} holds no .tar shards")
    return [f"{input_dir.rstrip('/')}/{name}" for name in names]


def task_plan(config: PrecacheConfig) -> tuple[list[int], int]:
    """(task ids to run, total task count) from NeMo's node_array_size / override_task_id / override_task_count."""
    if isinstance(config.node_array_size, str):
        first, last = (int(v) for v in config.node_array_size.split("-"))
        count = config.override_task_count
        ids = list(range(first, last + 1))
    else:
        count = config.override_task_count if config.override_task_count is not None else config.node_array_size
        ids = list(range(config.node_array_size)) if config.override_task_count is None else list(range(count))
    if config.override_task_id is not None:
        ids = [config.override_task_id]
    bad = [t for t in ids if not 0 <= t < count]
    if bad:
        raise ValueError(f"task ids {bad} are outside 0..{count - 1} (override_task_count={count})")
    return ids, count


def task_slice(files: list[str], task: int, count: int) -> list[str]:
    n = len(files)
    return files[task * n // count : (task + 1) * n // count]


def image_transform(image: Image.Image, config: ImageTransformConfig) -> torch.Tensor:
    """RGB image -> float tensor [3, H, W] in [-1, 1], resized and cropped as configured (deterministic)."""
    image = image.convert("RGB")
    if config.mode == "center_crop":
        scale = config.size / min(image.size)
        size = (max(config.size, round(image.width * scale)), max(config.size, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
        left, top = (image.width - config.size) // 2, (image.height - config.size) // 2
        image = image.crop((left, top, left + config.size, top + config.size))
    elif config.mode == "resize":
        image = image.resize((config.size, config.size), Image.Resampling.BICUBIC, reducing_gap=3.0)
    pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)
    return pixels.float().div(127.5).sub(1.0)


class SourceSamples(IterableDataset):
    """Samples of some source shards, from sample number `start` on: {"key", "inputs", "originals"} or
    {"key", "skip"}."""

    def __init__(self, shards: list[str], config: PrecacheConfig, start: int = 0):
        self.shards, self.config, self.start = shards, config, start
        originals = set(config.save_original_in_tar or [])
        self.keep = {e.extension for e in config.encodings if e.modality in originals}

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for number, (key, members) in enumerate(self._all_samples()):
            if number < self.start or (number - self.start) % workers != worker:
                continue
            yield {**self._decode(key, members), "number": number}

    def _all_samples(self):
        for shard in self.shards:
            tar_name = storage.basename(shard)
            for key, members in iter_samples(shard):
                yield f"{tar_name}/{key}", members

    def _decode(self, key: str, members: dict[str, bytes]) -> dict:
        unsafe = unsafe_sample_reason(key, members, self.config.trusted)
        if unsafe:  # a hostile name or a pickle-like member: never encoded, never copied
            return {"key": key, "skip": unsafe}
        inputs = {}
        for spec in self.config.encodings:
            data = members.get(spec.extension)
            if data is None:
                return {"key": key, "skip": f"missing member .{spec.extension}"}
            try:
                if spec.modality == "image":
                    with Image.open(io.BytesIO(data)) as image:
                        inputs[spec.key] = image_transform(image, self.config.image_transform)
                elif spec.modality == "video":
                    inputs[spec.key] = video_transform(data, self.config.video_transform)
                else:
                    inputs[spec.key] = data.decode("utf-8")
            except SkipSample as exc:  # a video too short, cut short, not a video: counted under its reason
                return {"key": key, "skip": f"{exc.reason}: {spec.extension}: {exc}"}
            except Exception as exc:  # a corrupt member: skip and count this sample, never replace it
                if storage.is_permanent(exc):  # ... but a full or read-only disk is not the sample's fault
                    raise
                return {"key": key, "skip": f"{spec.extension}: {type(exc).__name__}: {exc}"}
        originals = {ext: members[ext] for ext in sorted(self.keep) if ext in members}
        return {"key": key, "inputs": inputs, "originals": originals}


def output_shard_name(task: int, rank: int, number: int) -> str:
    return f"t{task}_r{rank}_{number}.tar"


OUTPUT_PATTERN = re.compile(r"t(\d+)_r(\d+)_(\d+)\.tar$")
