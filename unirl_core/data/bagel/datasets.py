"""The three BAGEL dataset types, sharded over ranks x workers and resumable to the exact next sample.

| type (registry key) | raw data                                              | unit of sharding | BAGEL's data index            |
|---------------------|-------------------------------------------------------|------------------|-------------------------------|
| `t2i_pretrain`      | parquet `{image: bytes, captions: JSON {"0": str}}`   | file             | `[parquet_idx, row_group_idx, row_idx]` |
| `unified_edit`      | parquet `{image_list: [bytes], instruction_list: [[str]]}` | row group   | `[row_group_idx, row_idx]`    |
| `vlm_sft`           | JSONL `{conversations, image | video}` + image folder | line             | `row_idx`                     |

Each worker walks its own units (`sharding.assign_files`: every unit exactly once, never a silent remainder) epoch
after epoch, in BAGEL's order under `target: bagel` (the mixture's; vlm_sft lines sorted by their text, as BAGEL
sorts its `(line, image_dir)` pairs) or this project's under `target: unirl`. A reader's `state()` is the layout
(world size, workers, seed, order, unit list) plus the last position it
returned; a reader built from a state continues with exactly the next sample and refuses a state from another
layout. Rows that cannot become samples (undecodable image, bad JSON, a conversation with no answer ...) are skipped
and counted by reason in `reader.skipped`, never silently; a worker whose whole pass yields nothing is an error.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import fsspec
import numpy as np
import pyarrow.parquet as pq
import torch

from unirl_core.data.bagel.config import BAGEL_SEED, DatasetInfo, GroupConfig
from unirl_core.data.bagel.jsonl import JsonLines
from unirl_core.data.bagel.plans import (
    Encode,
    Sample,
    SkipSample,
    edit_sample,
    expand_video,
    open_image,
    t2i_sample,
    vlm_sample,
)  # fmt: skip
from unirl_core.data.bagel.sharding import assign_files, check_identity, layout_identity
from unirl_core.io import storage

Position = tuple[int, int, int]  # (unit, chunk, row) within one worker's units


@dataclass(frozen=True)
class Layout:
    """Where this reader sits: data-parallel rank of world_size, each rank with num_workers loader workers."""

    rank: int = 0
    world_size: int = 1
    num_workers: int = 1
    seed: int | None = None  # shuffles the unit list, seeds every per-sample draw; None: the mixture's (42, or 0)


def _list_parquet(data_dir: str) -> list[str]:
    fs, root = fsspec.core.url_to_fs(data_dir)
    files = sorted(p for p in fs.ls(root, detail=False) if p.endswith(".parquet"))
    if not files:
        raise ValueError(f"no .parquet files in {data_dir}: point data_dir at the folder holding the parquet files")
    if storage.is_url(data_dir):
        files = [fs.unstrip_protocol(p) for p in files]
    return files


def _use(items: list, count: int | None) -> list:
    """BAGEL's num_used_data: the first `count` items, the list repeated when `count` is larger (upsampling)."""
    if count is None:
        return list(items)
    repeats, extra = divmod(count, len(items))
    return list(items) * repeats + list(items)[:extra]


class BagelDataset:
    """One group of a mixture. Subclasses say what a unit is, how many chunks and rows it has, and how a row
    becomes a sample."""

    kind: ClassVar[str]
    unit_name: ClassVar[str] = "files"

    def __init__(
        self, group: GroupConfig, infos: list[DatasetInfo], encode: Encode, layout: Layout = Layout(),
        target: str = "bagel",
    ):  # fmt: skip
        if layout.seed is None:  # built without a mixture: the target's default seed
            layout = dataclasses.replace(layout, seed=BAGEL_SEED if target == "bagel" else 0)
        self.name, self.group, self.encode, self.layout, self.target = self.kind, group, encode, layout, target
        self.vae = group.image_transform_args.build(target) if group.image_transform_args else None
        self.vit = group.vit_image_transform_args.build(target) if group.vit_image_transform_args else None
        counts = group.num_used_data or [None] * len(infos)
        self.units = self._all_units([self._units(info, count) for info, count in zip(infos, counts, strict=True)])
        self.assigned = assign_files(self.units, layout.world_size, layout.num_workers, layout.seed, self.unit_name,
                                     order=target, sort_key=self._bagel_sort_key())  # fmt: skip
        self._identity = {"dataset": self.name, "rank": layout.rank} | layout_identity(
            self.units, layout.world_size, layout.num_workers, layout.seed, target
        )

    def reader(self, worker_id: int = 0, state: dict[str, Any] | None = None) -> DatasetReader:
        if not 0 <= worker_id < self.layout.num_workers:
            raise ValueError(f"worker_id {worker_id} is outside 0..{self.layout.num_workers - 1}")
        return DatasetReader(self, worker_id, state)

    def __iter__(self) -> Iterator[Sample]:
        """Endless samples of this rank's worker (the DataLoader worker this runs in, else worker 0)."""
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers != self.layout.num_workers:
            raise ValueError(
                f"the DataLoader has {info.num_workers} workers but the layout says {self.layout.num_workers}"
            )
        return self.reader(info.id if info is not None else 0)

    def identity(self) -> dict[str, Any]:
        return dict(self._identity)

    # ---- what a subclass provides ----
    def _units(self, info: DatasetInfo, count: int | None) -> list:
        raise NotImplementedError

    def _all_units(self, per_dataset: list[list]) -> list:
        return [unit for units in per_dataset for unit in units]

    def _bagel_sort_key(self):
        """What BAGEL sorts this type's units by before its shuffle; None: the units themselves."""
        return None

    def _chunks(self, unit) -> int:
        return 1

    def _rows(self, unit, chunk: int) -> Any:
        """Something with len() and [row] giving the raw row."""
        raise NotImplementedError

    def _sample(self, row: Any, rng: random.Random, data_indexes: dict[str, Any]) -> Sample:
        raise NotImplementedError

    def _bagel_index(self, position: Position) -> Any:
        raise NotImplementedError

    def _position(self, bagel_index: Any) -> Position:
        raise NotImplementedError


class DatasetReader:
    """One worker's endless walk over its units; `state()` / a new reader with that state resume exactly."""

    def __init__(self, dataset: BagelDataset, worker_id: int, state: dict[str, Any] | None):
        self.dataset, self.worker_id = dataset, worker_id
        self.dataset_name = dataset.name
        self.units = dataset.assigned[dataset.layout.rank][worker_id]
        self.skipped: Counter[str] = Counter()
        self.epoch, self.position = 0, None  # position: the last one returned (or skipped)
        self._chunk_key, self._chunk_rows = None, None
        if state is not None:
            check_identity(state, dataset.identity())  # the same dataset, rank, world size, workers, seed, units
            if state.get("worker_id") != worker_id:
                raise ValueError(f"resume state of {dataset.name!r} worker {state.get('worker_id')} given to worker "
                                 f"{worker_id}: give each DataLoader worker its own state")  # fmt: skip
            self.epoch = int(state["epoch"])
            self.position = tuple(state["position"]) if state["position"] is not None else None
            self.skipped.update(state.get("skipped", {}))

    def state(self) -> dict[str, Any]:
        position = list(self.position) if self.position is not None else None
        skipped = dict(self.skipped)
        return self.dataset.identity() | {"worker_id": self.worker_id, "epoch": self.epoch, "position": position,
                                          "skipped": skipped}  # fmt: skip

    def __iter__(self) -> DatasetReader:
        return self

    def __next__(self) -> Sample:
        wraps = 0
        while True:
            position, wrapped = self._advance()
            if wrapped:
                wraps += 1
                if wraps > 1:
                    raise ValueError(
                        f"{self.dataset_name} rank {self.dataset.layout.rank} worker {self.worker_id}: no usable "
                        f"sample in a whole pass over its {len(self.units)} {self.dataset.unit_name} "
                        f"(skipped so far: {dict(self.skipped)})"
                    )
            self.position = position
            try:
                return self._build(position, self.epoch)
            except SkipSample as skip:
                self.skipped[skip.reason] += 1

    def sample_at(self, data_indexes: dict[str, Any]) -> Sample:
        """The sample returned earlier with these data indexes, rebuilt exactly (same per-sample draws)."""
        position = self.dataset._position(data_indexes["data_indexes"])
        return self._build(position, int(data_indexes["epoch"]))

    def _build(self, position: Position, epoch: int) -> Sample:
        unit, chunk, row = position
        layout = self.dataset.layout
        rng = random.Random(
            f"{layout.seed}:{self.dataset_name}:{layout.rank}:{self.worker_id}:{epoch}:{unit}:{chunk}:{row}"
        )
        indexes = {"data_indexes": self.dataset._bagel_index(position), "worker_id": self.worker_id,
                   "dataset_name": self.dataset_name, "epoch": epoch}  # fmt: skip
        return self.dataset._sample(self._rows(unit, chunk)[row], rng, indexes)

    def _rows(self, unit: int, chunk: int) -> Any:
        if self._chunk_key != (unit, chunk):
            self._chunk_key, self._chunk_rows = (unit, chunk), self.dataset._rows(self.units[unit], chunk)
        return self._chunk_rows

    def _advance(self) -> tuple[Position, bool]:
        """The position after `self.position` (moving to the next epoch at the end), and whether it wrapped."""
        wrapped = False
        unit, chunk, row = self.position if self.position is not None else (0, 0, -1)
        row += 1
        while True:
            if unit >= len(self.units):
                self.epoch, unit, chunk, row, wrapped = self.epoch + 1, 0, 0, 0, True
            if chunk >= self.dataset._chunks(self.units[unit]):
                unit, chunk, row = unit + 1, 0, 0
                continue
            if row >= len(self._rows(unit, chunk)):
                chunk, row = chunk + 1, 0
                continue
            return (unit, chunk, row), wrapped


class _ParquetRows:
    """One row group's columns, indexable by row."""

    def __init__(self, path: str, row_group: int, columns: list[str]):
        with fsspec.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            if row_group >= parquet.num_row_groups:
                raise ValueError(
                    f"{path} has {parquet.num_row_groups} row groups, but row group {row_group} was listed (is its "
                    "parquet_info stale? regenerate it)"
                )
            table = parquet.read_row_group(row_group, columns=columns)
        self.columns = {name: table.column(name) for name in columns}
        self.num_rows = table.num_rows

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, row: int) -> dict[str, Any]:
        return {name: column[row].as_py() for name, column in self.columns.items()}


def _check_columns(path: str, columns: list[str]) -> None:
    with fsspec.open(path, "rb") as handle:
        names = pq.ParquetFile(handle).schema_arrow.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"{path} lacks the columns {missing} (it has {names})")


class T2IDataset(BagelDataset):
    """`t2i_pretrain`: units are parquet files, chunks their row groups."""

    kind = "t2i_pretrain"
    columns = ["image", "captions"]

    def __init__(self, *args, **kwargs):
        self._row_groups: dict[str, int] = {}  # file -> row groups, read once
        super().__init__(*args, **kwargs)

    def _units(self, info: DatasetInfo, count: int | None) -> list[str]:
        if not info.data_dir:
            raise ValueError("t2i_pretrain: each dataset_info entry needs data_dir (the folder of parquet files)")
        files = _list_parquet(info.data_dir)
        _check_columns(files[0], self.columns)
        return _use(files, count)

    def _chunks(self, unit: str) -> int:
        if unit not in self._row_groups:
            with fsspec.open(unit, "rb") as handle:
                self._row_groups[unit] = pq.ParquetFile(handle).num_row_groups
        return self._row_groups[unit]

    def _rows(self, unit: str, chunk: int) -> _ParquetRows:
        return _ParquetRows(unit, chunk, self.columns)

    def _sample(self, row, rng, data_indexes) -> Sample:
        if self.vae is None:
            raise ValueError("t2i_pretrain needs image_transform_args in its group config")
        if row["image"] is None:
            raise SkipSample("bad_image", "no image bytes")
        return t2i_sample(row["image"], row["captions"], self.encode, self.vae, rng, data_indexes)

    def _bagel_index(self, position: Position) -> list[int]:
        return list(position)

    def _position(self, bagel_index) -> Position:
        return tuple(bagel_index)


class EditDataset(BagelDataset):
    """`unified_edit`: units are (file, row group) pairs listed by the parquet_info JSON."""

    kind = "unified_edit"
    unit_name = "row groups"
    columns = ["image_list", "instruction_list"]

    def _units(self, info: DatasetInfo, count: int | None) -> list[tuple[str, int]]:
        if not info.data_dir:
            raise ValueError("unified_edit: each dataset_info entry needs data_dir (the folder of parquet files)")
        files = _use(_list_parquet(info.data_dir), count)
        _check_columns(files[0], self.columns)
        row_groups = self._row_groups(info, files)
        return [(path, group) for path in files for group in range(row_groups[path])]

    @staticmethod
    def _row_groups(info: DatasetInfo, files: list[str]) -> dict[str, int]:
        if info.parquet_info_path is None:  # ours: read the counts from the files
            counts = {}
            for path in set(files):
                with fsspec.open(path, "rb") as handle:
                    counts[path] = pq.ParquetFile(handle).num_row_groups
            return counts
        parquet_info = json.loads(storage.read_text(info.parquet_info_path))
        missing = [path for path in files if path not in parquet_info]
        if missing:
            raise ValueError(
                f"{info.parquet_info_path} has no entry for {missing[0]} ({len(missing)} files missing): its keys "
                "must be the real absolute paths of the parquet files (regenerate it, e.g. with `unirl bagel export`)"
            )
        return {path: int(parquet_info[path]["num_row_groups"]) for path in files}

    def _rows(self, unit: tuple[str, int], chunk: int) -> _ParquetRows:
        return _ParquetRows(unit[0], unit[1], self.columns)

    def _sample(self, row, rng, data_indexes) -> Sample:
        if self.vae is None or self.vit is None:
            raise ValueError("unified_edit needs image_transform_args and vit_image_transform_args")
        images, instructions = row["image_list"] or [], row["instruction_list"] or []
        return edit_sample(images, instructions, self.encode, self.vae, self.vit, rng, data_indexes)

    def _bagel_index(self, position: Position) -> list[int]:
        return [position[0], position[2]]

    def _position(self, bagel_index) -> Position:
        return bagel_index[0], 0, bagel_index[1]


class VLMDataset(BagelDataset):
    """`vlm_sft`: units are JSONL lines; images (or a video's frames) come from the dataset's image folder."""

    kind = "vlm_sft"
    unit_name = "lines"

    def __init__(
        self, group: GroupConfig, infos: list[DatasetInfo], encode: Encode, layout: Layout = Layout(),
        target: str = "bagel",
    ):  # fmt: skip
        # per JSONL: its line index, the line numbers in use (shuffled and cut; None: all, in file order), images
        self._lines: list[JsonLines] = []
        self._used: list[np.ndarray | None] = []
        self._image_dirs: list[str] = []
        super().__init__(group, infos, encode, layout, target)
        self.frame_sampler = None
        if group.frame_sampler_args is not None:
            from unirl_core.data.bagel.video import FrameSampler

            self.frame_sampler = FrameSampler(**group.frame_sampler_args.model_dump(), target=target)

    def _units(self, info: DatasetInfo, count: int | None) -> range:
        if not info.jsonl_path or not info.data_dir:
            raise ValueError("vlm_sft: each dataset_info entry needs jsonl_path and data_dir (the image folder)")
        lines = JsonLines(info.jsonl_path)
        used = None
        if self.group.shuffle_lines:  # the permutation BAGEL's random.Random(seed).shuffle(lines) makes
            order = list(range(len(lines)))
            random.Random(self.group.shuffle_seed).shuffle(order)
            used = np.asarray(order, dtype=np.int64)
        total = len(lines) if count is None else min(count, len(lines))
        if used is not None:
            used = used[:total]
        self._lines.append(lines)
        self._used.append(used)
        self._image_dirs.append(info.data_dir)
        return range(total)

    def _all_units(self, per_dataset: list[range]) -> np.ndarray:
        """Units are integers (no Python object per line): the JSONLs' used lines numbered one after another."""
        self._bases = np.cumsum([0] + [len(units) for units in per_dataset])
        return np.arange(self._bases[-1], dtype=np.int64)

    def _bagel_sort_key(self):
        """BAGEL sorts its (line, image_dir) pairs: by the line's text (with the newline `readlines` keeps), then the
        image folder. Reads every used line once, here, to order them."""

        def key(unit: int) -> tuple[bytes, str]:
            line, image_dir = self._rows(unit, 0)[0]
            return line + b"\n", image_dir

        return key

    def _rows(self, unit: int, chunk: int) -> list[tuple[bytes, str]]:
        source = int(np.searchsorted(self._bases, unit, side="right")) - 1
        index = int(unit) - int(self._bases[source])
        used = self._used[source]
        line = index if used is None else int(used[index])
        return [(self._lines[source][line], self._image_dirs[source])]

    def _sample(self, row, rng, data_indexes) -> Sample:
        vit = self.vae  # BAGEL's vlm_sft reads its ViT transform from `image_transform_args`
        if vit is None:
            raise ValueError("vlm_sft needs image_transform_args (the ViT transform, stride 14) in its group config")
        line, image_dir = row
        try:
            item = json.loads(line)  # bytes: UTF-8 (a BOM too) or UTF-16/32, as json detects
            conversations = item["conversations"]
        except (ValueError, KeyError, TypeError) as error:
            raise SkipSample("bad_json", f"{type(error).__name__}: {error}") from error
        images = []
        if "image" in item:
            names = item["image"] if isinstance(item["image"], list) else [item["image"]]
            images = [open_image(self._open(image_dir, name)) for name in names]
        elif "video" in item:
            images = self._frames(storage.join(image_dir, item["video"]), rng)
            conversations = expand_video(conversations, len(images))
        return vlm_sample(conversations, images, self.encode, vit, data_indexes, self.target)

    @staticmethod
    def _open(image_dir: str, name: str) -> bytes | str:
        path = storage.join(image_dir, name)
        if storage.is_url(path):
            try:
                return storage.read_bytes(path)
            except FileNotFoundError as error:
                raise SkipSample("missing_image", path) from error
        return path

    def _frames(self, path: str, rng: random.Random) -> list:
        from unirl_core.data.bagel.video import FrameSampler, VideoDecodeError

        sampler = self.frame_sampler or FrameSampler(target=self.target)
        try:
            frames, _ = sampler(path, rng)
        except VideoDecodeError as error:
            raise SkipSample("bad_video", str(error)) from error
        return frames

    def _bagel_index(self, position: Position) -> int:
        return position[0]

    def _position(self, bagel_index) -> Position:
        return int(bagel_index), 0, 0


DATASET_REGISTRY: dict[str, type[BagelDataset]] = {cls.kind: cls for cls in (T2IDataset, EditDataset, VLMDataset)}
