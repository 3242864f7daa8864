"""Ingested WebDataset shards -> BAGEL's three raw data formats (FORMATS.md 5), read by BAGEL's loaders unchanged.

| function    | BAGEL type     | writes in `out_dir`                                                                   |
|-------------|----------------|---------------------------------------------------------------------------------------|
| export_t2i  | `t2i_pretrain` | part-NNNNN.parquet {image: binary, captions: string, JSON {"0": str, "1": str, ...}} |
| export_edit | `unified_edit` | part-NNNNN.parquet {image_list: list<binary>, instruction_list: list<list<string>>}  |
| export_vlm  | `vlm_sft`      | images/<key>.<ext> and data.jsonl {conversations: [human, gpt], image: "<key>.<ext>"} |

The parquet exports also write `parquet_info.json` ({"<path>": {"num_row_groups": N}}). BAGEL looks a file up
under `os.path.join(data_dir, name)`, so `data_dir` is the real absolute path of `out_dir` (symlinks resolved; the
URL as given for a remote store) and the keys are built from it. Parquet files hold several row groups each, so
BAGEL's file and row-group sharding has units to spread. Every export writes `export_summary.json` (counts, skip
reasons, settings, sources), `bagel_data.yaml` and LAST `dataset_info.json`, its commit record:
- `dataset_info.json`: the entry to paste under `DATASET_INFO[<type>][<name>]` in BAGEL's `data/dataset_info.py`
  (or a unirl mixture's `dataset_info`), with the keys BAGEL's constructors take under `target: bagel`: t2i
  `data_dir`, `num_files`, `num_total_samples` (T2IIterableDataset has no `parquet_info` argument); edit the same
  plus `parquet_info_path` (required there); vlm `data_dir` (the image folder), `jsonl_path`, `num_total_samples`.
  `target: unirl` also writes `parquet_info_path` for t2i (only this project reads it).
- `bagel_data.yaml`: the group for BAGEL's `--dataset_config_file` (groups only, as BAGEL's YAML holds no other
  key), named `<name>` (default: the output folder's name), with BAGEL's example settings for the type and the
  arguments its constructors require: `num_used_data` (every file once; vlm: every line) and, for vlm_sft,
  `frame_sampler_args`.

Sources (t2i, vlm): a dataset root or its `shards/` folder (the shards that `_reorganize.json` commits, the
incomplete tail included, in record order), any other folder of `*.tar` (sorted), one tar, or a list of tars (in
the order given). Samples come shard by shard, in key order within a shard. Images are the original encoded bytes,
never re-encoded. A sample without an image member, with an image Pillow cannot decode, or with one over BAGEL's
pixel limit is skipped and counted by reason: nothing is dropped without a count.

Edit source: a JSONL file, one editing trajectory per line (blank lines ignored):
    {"images": ["cat/0.png", "cat/1.png", "/data/cat/2.png"], "instructions": [["make it red", "turn it red"], ["add a hat"]]}
`images` are paths or URLs, relative ones resolved against the JSONL's folder; at least 2 per line.
`instructions` holds one list of interchangeable phrasings per step (BAGEL picks one at random), so exactly
len(images) - 1 lists of non-empty strings. A line breaking these rules, or naming a missing or undecodable image,
is skipped and counted by reason.

Writes are atomic (temporary name, then rename; one upload on object stores) and outputs are a pure function of
inputs and settings: a re-run rewrites the same bytes and removes files of an earlier export it does not write (a
parquet part beyond the new count, a stale image), since BAGEL lists every `*.parquet` in `data_dir`. A `*.parquet`
in `out_dir` that is not `part-NNNNN.parquet` is refused rather than deleted.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image

from unirl_core.data.bagel.transforms import TARGETS
from unirl_core.ingest.reorganize import REORGANIZE_RECORD, shards_folder
from unirl_core.io import storage
from unirl_core.io.tars import iter_samples

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # member extensions taken as the image, first present wins
BAGEL_MAX_PIXELS = 2 * 20_000_000  # BAGEL sets Image.MAX_IMAGE_PIXELS = 20M; Pillow refuses above twice that
PART = re.compile(r"part-\d{5}\.parquet")
PARQUET_INFO, DATASET_INFO, SUMMARY, JSONL, BAGEL_DATA = (
    "parquet_info.json",
    "dataset_info.json",
    "export_summary.json",
    "data.jsonl",
    "bagel_data.yaml",
)
VERIFY_THREADS, VERIFY_BATCH = 8, 64  # Pillow decodes without the GIL: images are checked on a small pool
# Images are already compressed; pinned options so the same inputs give the same bytes across pyarrow defaults.
PARQUET_OPTIONS = {"compression": "snappy", "use_dictionary": False, "write_statistics": False}

T2I_SCHEMA = pa.schema([("image", pa.binary()), ("captions", pa.string())])
EDIT_SCHEMA = pa.schema([("image_list", pa.list_(pa.binary())), ("instruction_list", pa.list_(pa.list_(pa.string())))])


class _Skip(Exception):
    """A sample or row left out of the export, with the reason it is counted under."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------------- the exports


def export_t2i(
    shards_root_or_tars: str | Sequence[str],
    out_dir: str,
    *,
    rows_per_file: int = 4096,
    rows_per_row_group: int = 256,
    caption_keys: Sequence[str] = ("txt",),
    target: str = "bagel",
    dataset_name: str | None = None,
) -> dict[str, Any]:
    """BAGEL `t2i_pretrain` parquet: one row per sample, `image` (original bytes) and `captions` (JSON object).

    `rows_per_file` rows per part file and `rows_per_row_group` rows per row group (the last of each smaller).
    `caption_keys`: where captions come from, in order: "txt" is the `.txt` member, any other name a field of the
    `.json` member (a string, a list of strings, or a {"0": ..., "1": ...} object, as ingest keeps one from
    `captions_json_col`: pass ("txt", "captions") to keep them all). Blank and repeated captions are dropped; a
    sample left with none is kept with "{}" (BAGEL then trains it unconditioned) and counted in `without_caption`.
    """
    _check_rows(rows_per_file, rows_per_row_group)
    _check_target(target)
    if not caption_keys or isinstance(caption_keys, str):
        raise ValueError(f"caption_keys={caption_keys!r} must be a non-empty sequence of names, e.g. ('txt',)")
    tars, out = source_shards(shards_root_or_tars), _begin_parquet(out_dir)
    skipped, without_caption = Counter(), Counter()

    def counted(rows: Iterator[dict]) -> Iterator[dict]:
        for row in rows:
            without_caption["rows"] += row["captions"] == "{}"
            yield row

    rows = counted(_decodable(_t2i_candidates(tars, tuple(caption_keys), skipped), skipped))
    parts = _write_parts(out, rows, T2I_SCHEMA, rows_per_file, rows_per_row_group)
    settings = {"rows_per_file": rows_per_file, "rows_per_row_group": rows_per_row_group, "caption_keys": caption_keys}
    extra = {"without_caption": without_caption["rows"]}
    return _commit_parquet(out, "t2i_pretrain", parts, skipped, tars, settings, extra, target, dataset_name)


def export_edit(
    source: str,
    out_dir: str,
    *,
    rows_per_file: int = 1024,
    rows_per_row_group: int = 64,
    target: str = "bagel",
    dataset_name: str | None = None,
) -> dict[str, Any]:
    """BAGEL `unified_edit` parquet from a JSONL of editing trajectories (format in the module docstring): one row
    per valid line, `image_list` (original bytes) and `instruction_list` (phrasings per step), in line order."""
    _check_rows(rows_per_file, rows_per_row_group)
    _check_target(target)
    if not storage.exists(source):
        raise ValueError(f"edit source {source} does not exist: give a JSONL of {{images, instructions}} lines")
    out, skipped = _begin_parquet(out_dir), Counter()
    rows = _decodable(_edit_candidates(source, skipped), skipped)
    parts = _write_parts(out, rows, EDIT_SCHEMA, rows_per_file, rows_per_row_group)
    settings = {"rows_per_file": rows_per_file, "rows_per_row_group": rows_per_row_group}
    return _commit_parquet(out, "unified_edit", parts, skipped, [source], settings, {}, target, dataset_name)


def export_vlm(
    shards_root_or_tars: str | Sequence[str],
    out_dir: str,
    *,
    prompt: str = "Describe the image.",
    target: str = "bagel",
    dataset_name: str | None = None,
) -> dict[str, Any]:
    """BAGEL `vlm_sft`: `images/<key>.<ext>` (original bytes) and `data.jsonl`, one captioning conversation per
    sample ("<image>\\n" + prompt -> caption). A sample whose `.txt` caption is missing or blank is skipped and
    counted as `empty_caption`."""
    if not prompt.strip() or "<image>" in prompt:
        raise ValueError(f"prompt {prompt!r} must be non-empty text without '<image>' (the export puts it first)")
    _check_target(target)
    tars, out = source_shards(shards_root_or_tars), _begin(out_dir)
    images_dir, jsonl_path, skipped, names = f"{out}/images", f"{out}/{JSONL}", Counter(), set()
    storage.remove_temporaries(out, JSONL)
    with storage.atomic_local_file(jsonl_path) as tmp, open(tmp, "w", encoding="utf-8") as jsonl:
        for name, data, caption in _decodable(_vlm_candidates(tars, skipped), skipped):
            storage.write_bytes_atomic(f"{images_dir}/{name}", data)
            conversations = [
                {"from": "human", "value": "<image>\n" + prompt},
                {"from": "gpt", "value": caption},
            ]
            jsonl.write(json.dumps({"conversations": conversations, "image": name}, ensure_ascii=False) + "\n")
            names.add(name)
        _require_samples(len(names), skipped)
    _remove_stale_images(images_dir, names)
    info = {"data_dir": images_dir, "jsonl_path": jsonl_path, "num_total_samples": len(names)}
    summary = _summary("vlm_sft", out, [jsonl_path], len(names), skipped, tars, {"prompt": prompt}, info)
    return _commit(out, summary | _group("vlm_sft", out, dataset_name, len(names), target))


# ---------------------------------------------------------------------------------------------------- the sources


def source_shards(source: str | Sequence[str]) -> list[str]:
    """The tars to read, in order: a list as given; a dataset root or its shards folder: the shards its
    `_reorganize.json` commits; any other folder: its `*.tar`, sorted; a `.tar` path: itself."""
    if not isinstance(source, str | os.PathLike):
        tars = [str(t) for t in source]
        if not tars:
            raise ValueError("the list of tars to export is empty")
        return tars
    source = str(source).rstrip("/")
    if source.endswith(".tar"):
        return [source]
    for folder in (shards_folder(source), source):
        if storage.exists(f"{folder}/{REORGANIZE_RECORD}"):
            record = json.loads(storage.read_text(f"{folder}/{REORGANIZE_RECORD}"))
            return [f"{folder}/{shard['name']}" for shard in record["shards"]]
    fs, path = fsspec.core.url_to_fs(source)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) if fs.isdir(path) else []
    tars = [f"{source}/{name}" for name in names if name.endswith(".tar")]
    if not tars:
        raise ValueError(f"{source} is neither a dataset root, a shards folder, a folder of .tar files nor a .tar")
    return tars


def _t2i_candidates(tars: list[str], caption_keys: tuple[str, ...], skipped: Counter) -> Iterator[tuple[dict, list]]:
    for tar in tars:
        for _key, members in iter_samples(tar):
            try:
                _ext, image = _image_member(members)
                captions = _captions(members, caption_keys)
            except _Skip as skip:
                skipped[skip.reason] += 1
                continue
            text = json.dumps({str(i): c for i, c in enumerate(captions)}, ensure_ascii=False)
            yield {"image": image, "captions": text}, [image]


def _vlm_candidates(tars: list[str], skipped: Counter) -> Iterator[tuple[tuple[str, bytes, str], list]]:
    """(image file name, image bytes, caption); a key seen twice would overwrite an image: refused."""
    first_seen: dict[str, str] = {}
    for tar in tars:
        for key, members in iter_samples(tar):
            if key in first_seen:
                raise ValueError(f"sample key {key!r} is in {first_seen[key]} and {tar}: image names would collide; "
                                 "export those shards separately (img2dataset keys restart per folder)")  # fmt: skip
            first_seen[key] = tar
            try:
                ext, image = _image_member(members)
                caption = _utf8(members.get("txt", b""))
                if not caption.strip():
                    raise _Skip("empty_caption")
                if any(part in ("", ".", "..") for part in key.split("/")):
                    raise _Skip("unsafe_key")  # would escape images/ or name a folder
            except _Skip as skip:
                skipped[skip.reason] += 1
                continue
            yield (f"{key}.{ext}", image, caption), [image]


def _edit_candidates(jsonl: str, skipped: Counter) -> Iterator[tuple[dict, list]]:
    folder = storage.parent(jsonl)
    with fsspec.open(jsonl, "rt", encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                paths, steps = _edit_row(line)
                images = [_read_image(_resolve(folder, p)) for p in paths]
            except _Skip as skip:
                skipped[skip.reason] += 1
                continue
            yield {"image_list": images, "instruction_list": steps}, images


def _edit_row(line: str) -> tuple[list[str], list[list[str]]]:
    """(image paths, instruction options per step) of one JSONL line, or _Skip naming the broken rule."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        raise _Skip("invalid_row") from None
    images, steps = (row.get("images"), row.get("instructions")) if isinstance(row, dict) else (None, None)
    if not _strings(images) or not isinstance(steps, list) or not all(_strings(s) for s in steps):
        raise _Skip("invalid_row")
    if len(images) < 2:
        raise _Skip("too_few_images")
    if len(steps) != len(images) - 1:
        raise _Skip("instruction_count_mismatch")
    if any(not options or not all(o.strip() for o in options) for options in steps):
        raise _Skip("empty_instruction")
    return images, steps


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _resolve(folder: str, path: str) -> str:
    return path if storage.is_url(path) or os.path.isabs(path) else storage.join(folder, path)


def _read_image(path: str) -> bytes:
    try:
        return storage.read_bytes(path)
    except FileNotFoundError:
        raise _Skip("missing_image") from None


def _image_member(members: dict[str, bytes]) -> tuple[str, bytes]:
    for ext in IMAGE_EXTENSIONS:
        if members.get(ext):
            return ext, members[ext]
    raise _Skip("no_image")


def _captions(members: dict[str, bytes], caption_keys: tuple[str, ...]) -> list[str]:
    """The sample's captions from `caption_keys`, in order, blank ones dropped, each once."""
    found, metadata = [], None
    for name in caption_keys:
        if name == "txt":
            found += [_utf8(members["txt"])] if "txt" in members else []
            continue
        if metadata is None:
            metadata = _metadata(members)
        found += _caption_values(metadata.get(name))
    return list(dict.fromkeys(c for c in found if c.strip()))


def _caption_values(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):  # BAGEL's {"0": ..., "1": ...}: numeric keys in numeric order
        value = [value[k] for k in sorted(value, key=lambda k: (int(k), k) if k.isdigit() else (1 << 62, k))]
    values = [value] if isinstance(value, str) else value
    if not _strings(values):
        raise _Skip("bad_caption")
    return values


def _metadata(members: dict[str, bytes]) -> dict:
    if "json" not in members:
        return {}
    try:
        metadata = json.loads(members["json"])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _Skip("bad_metadata") from None
    if not isinstance(metadata, dict):
        raise _Skip("bad_metadata")
    return metadata


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _Skip("bad_caption") from None


# ---------------------------------------------------------------------------------------------------- image checks


def _decodable(items: Iterable[tuple[Any, list[bytes]]], skipped: Counter) -> Iterator[Any]:
    """The items whose images all decode (checked on a thread pool, order kept); the others counted by reason."""
    with ThreadPoolExecutor(VERIFY_THREADS) as pool:
        for batch in _batches(items, VERIFY_BATCH):
            for (item, _), problem in zip(
                batch, pool.map(_images_problem, [images for _, images in batch]), strict=True
            ):
                if problem is None:
                    yield item
                else:
                    skipped[problem] += 1


def _images_problem(images: list[bytes]) -> str | None:
    return next((p for p in map(_image_problem, images) if p is not None), None)


def _image_problem(data: bytes) -> str | None:
    """None when Pillow decodes `data` whole within BAGEL's pixel limit; else the skip reason."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > BAGEL_MAX_PIXELS:
                return "image_too_large"
            image.load()
    except Image.DecompressionBombError:
        return "image_too_large"
    except Exception:  # corrupt files raise OSError, SyntaxError, struct.error, ...: BAGEL would skip it too; counted
        return "undecodable_image"
    return None


def _batches(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


# ---------------------------------------------------------------------------------------------------- writing


def _check_rows(rows_per_file: int, rows_per_row_group: int) -> None:
    if not 1 <= rows_per_row_group <= rows_per_file:
        raise ValueError(f"need 1 <= rows_per_row_group ({rows_per_row_group}) <= rows_per_file ({rows_per_file})")


def _begin(out_dir: str) -> str:
    """Create `out_dir`, drop its commit record (an interrupted export must not look finished); its resolved path."""
    out_dir = str(out_dir).rstrip("/")
    fs, path = fsspec.core.url_to_fs(out_dir)
    fs.makedirs(path, exist_ok=True)
    out = out_dir if storage.is_url(out_dir) else os.path.realpath(out_dir)
    _remove(f"{out}/{DATASET_INFO}")
    return out


def _begin_parquet(out_dir: str) -> str:
    out = _begin(out_dir)
    foreign = [name for name in _names(out) if name.endswith(".parquet") and not PART.fullmatch(name)]
    if foreign:
        raise ValueError(f"{out} holds parquet files this export did not write ({', '.join(sorted(foreign)[:5])}): "
                         "BAGEL would read every *.parquet there; export into an empty folder")  # fmt: skip
    storage.remove_temporaries(out, "part-")
    return out


def _write_parts(out: str, rows: Iterator[dict], schema: pa.Schema, rows_per_file: int, rows_per_group: int) -> list:
    """part-NNNNN.parquet files of `rows_per_file` rows in row groups of `rows_per_group`; [{name, rows, groups}]."""
    rows, parts = iter(rows), []
    while True:
        groups = _batches(itertools.islice(rows, rows_per_file), rows_per_group)
        first = next(groups, None)
        if first is None:
            return parts
        name, sizes = f"part-{len(parts):05d}.parquet", []
        with (
            storage.atomic_local_file(f"{out}/{name}") as tmp,
            pq.ParquetWriter(tmp, schema, **PARQUET_OPTIONS) as writer,
        ):
            for group in itertools.chain([first], groups):
                writer.write_table(pa.Table.from_pylist(group, schema), row_group_size=len(group))
                sizes.append(len(group))
        parts.append({"name": name, "num_rows": sum(sizes), "num_row_groups": len(sizes)})


def _commit_parquet(out, data_type, parts, skipped, sources, settings, extra, target, dataset_name) -> dict:
    samples = sum(p["num_rows"] for p in parts)
    _require_samples(samples, skipped)
    keep = {p["name"] for p in parts}
    for name in _names(out):
        if PART.fullmatch(name) and name not in keep:
            _remove(f"{out}/{name}")  # a part of an earlier, larger export: BAGEL would read it
    files = [f"{out}/{p['name']}" for p in parts]
    parquet_info = {path: {"num_row_groups": p["num_row_groups"]} for path, p in zip(files, parts, strict=True)}
    storage.write_bytes_atomic(f"{out}/{PARQUET_INFO}", _json(parquet_info))
    info = {"data_dir": out, "num_files": len(parts), "num_total_samples": samples}
    if data_type == "unified_edit" or target == "unirl":  # BAGEL's T2IIterableDataset refuses a parquet_info
        info["parquet_info_path"] = f"{out}/{PARQUET_INFO}"
    summary = _summary(data_type, out, files, samples, skipped, sources, settings, info) | extra
    return _commit(out, summary | _group(data_type, out, dataset_name, len(parts), target))


# BAGEL's data/configs/example.yaml settings per type: what `bagel_data.yaml` starts from
BAGEL_GROUPS: dict[str, dict[str, Any]] = {
    "t2i_pretrain": {"image_transform_args": {"image_stride": 16, "max_image_size": 1024, "min_image_size": 512},
                     "is_mandatory": True, "weight": 1},
    "unified_edit": {"image_transform_args": {"image_stride": 16, "max_image_size": 1024, "min_image_size": 512},
                     "vit_image_transform_args": {"image_stride": 14, "max_image_size": 518, "min_image_size": 224},
                     "is_mandatory": False, "weight": 1},
    "vlm_sft": {"image_transform_args": {"image_stride": 14, "max_image_size": 980, "min_image_size": 378,
                                         "max_pixels": 2_007_040},
                "frame_sampler_args": {"max_num_frames": 12, "min_num_frames": 8}, "is_mandatory": True,
                "shuffle_lines": True, "shuffle_seed": 0, "weight": 1},
}  # fmt: skip


def _check_target(target: str) -> None:
    if target not in TARGETS:
        raise ValueError(f"target {target!r}: use 'bagel' (entries BAGEL's trainer accepts) or 'unirl'")


def _group(data_type: str, out: str, name: str | None, units: int, target: str) -> dict[str, Any]:
    """Write `bagel_data.yaml` (this export as one group of a BAGEL data config); the summary keys naming it."""
    folders = out.rstrip("/").split("/")
    base = folders[-1]
    if base in ("t2i", "vlm", "edit") and len(folders) > 1:  # `<dataset>-bagel/<kind>`: named after the dataset
        base = folders[-2].removesuffix("-bagel")
    name = name or re.sub(r"[^A-Za-z0-9_]+", "_", base).strip("_") or data_type
    group = {"dataset_names": [name], **BAGEL_GROUPS[data_type], "num_used_data": [units]}
    header = (f"# BAGEL data config group for {out} (target: {target}). Put dataset_info.json under\n"
              f"# DATASET_INFO[{data_type!r}][{name!r}] in BAGEL's data/dataset_info.py; merge groups of one type.\n")  # fmt: skip
    storage.write_bytes_atomic(
        f"{out}/{BAGEL_DATA}", (header + yaml.safe_dump({data_type: group}, sort_keys=False)).encode()
    )
    return {
        "target": target,
        "dataset_name": name,
        "bagel_group": {data_type: group},
        "bagel_data": f"{out}/{BAGEL_DATA}",
    }


def _summary(data_type, out, files, samples, skipped, sources, settings, info) -> dict[str, Any]:
    return {
        "format": data_type,
        "out_dir": out,
        "files": files,
        "samples": samples,
        "skipped": dict(sorted(skipped.items())),
        "sources": [str(s) for s in sources],
        "settings": {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()},
        "dataset_info": info,
    }


def _commit(out: str, summary: dict[str, Any]) -> dict[str, Any]:
    storage.write_bytes_atomic(f"{out}/{SUMMARY}", _json(summary))
    storage.write_bytes_atomic(f"{out}/{DATASET_INFO}", _json(summary["dataset_info"]))  # the commit record: last
    return summary


def _require_samples(samples: int, skipped: Counter) -> None:
    if samples == 0:
        raise ValueError(f"no sample to export (skipped: {dict(sorted(skipped.items()))}): BAGEL cannot train on an "
                         "empty dataset; check the source")  # fmt: skip


def _remove_stale_images(images_dir: str, keep: set[str]) -> None:
    """Delete images of an earlier export that this one did not write (and temporaries of a killed one)."""
    fs, root = fsspec.core.url_to_fs(images_dir)
    root = root.rstrip("/")
    for path in fs.find(root):
        if path[len(root) + 1 :] not in keep:
            fs.rm(path)


def _names(folder: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(folder)
    return [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)]


def _remove(path: str) -> None:
    fs, fs_path = fsspec.core.url_to_fs(path)
    if fs.exists(fs_path):
        fs.rm(fs_path)


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False).encode("utf-8")
