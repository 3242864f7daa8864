"""Stage 1, download_parquet: find the inputs, check them, and split them into work units (file x row range).

Every input is opened and its columns checked before any download: a missing column, a wrong type, an empty file
or a corrupt footer is an `IngestInputError` naming the file (permanent: never retried). The plan is committed as
`units.json` and only ever grows: a re-run keeps every unit's number, and files that landed since get new units
after the last one, so their keys sort after every committed sample and existing full shards stay byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import fsspec
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from unirl_core.config.ingest import MAX_ROWS_PER_UNIT, IngestConfig
from unirl_core.io import storage

PLAN_FILE = "units.json"
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


class IngestInputError(ValueError):
    """An input that can never succeed (schema, emptiness, corruption): fail at once, do not retry."""


@dataclass(frozen=True)
class WorkUnit:
    index: int  # the 5-digit shard id of its raw shard and the prefix of its keys
    file: str  # input URL or absolute path
    start: int  # first row (inclusive)
    stop: int  # last row (exclusive)

    @property
    def name(self) -> str:
        return f"{self.index:05d}"


def input_format(path: str) -> str:
    for suffix, fmt in FORMATS.items():
        if path.lower().endswith(suffix):
            return fmt
    raise IngestInputError(f"{path}: unsupported input extension; use one of {', '.join(FORMATS)}")


def list_inputs(patterns: list[str]) -> list[str]:
    """Sorted, de-duplicated inputs matching the patterns (paths, globs, fsspec URLs); a pattern matching
    nothing is an error."""
    found: set[str] = set()
    for pattern in patterns:
        fs, path = fsspec.core.url_to_fs(pattern)
        matches = fs.glob(path) if any(ch in path for ch in "*?[") else ([path] if fs.exists(path) else [])
        matches = [m for m in matches if not fs.isdir(m)]
        if not matches:
            raise IngestInputError(f"download_parquet.parquet_pattern {pattern!r} matches no file")
        found.update(fs.unstrip_protocol(m) if storage.is_url(pattern) else m for m in matches)
    return sorted(found)


def open_batches(path: str, columns: list[str] | None, batch_size: int = 256) -> Iterator[pa.RecordBatch]:
    """Stream record batches of `columns` from a parquet, jsonl or csv file (never the whole file in memory)."""
    fmt = input_format(path)
    with fsspec.open(path, "rb") as f:
        if fmt == "parquet":
            yield from pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=columns)
        elif fmt == "jsonl":
            reader = pa_json.open_json(f, read_options=pa_json.ReadOptions(block_size=1 << 20))
            for batch in reader:
                yield batch if columns is None else batch.select(columns)
        else:
            convert = pa_csv.ConvertOptions(include_columns=columns)
            yield from pa_csv.open_csv(f, convert_options=convert)


def input_schema(path: str) -> pa.Schema:
    """The input's columns and types (parquet: from the footer; jsonl/csv: as the first block reads)."""
    if input_format(path) == "parquet":
        with fsspec.open(path, "rb") as f:
            return pq.ParquetFile(f).schema_arrow
    return next(iter(open_batches(path, columns=None))).schema


def inspect_input(path: str, config: IngestConfig) -> int:
    """Check the columns `config` needs; return the row count."""
    fmt = input_format(path)
    try:
        if fmt == "parquet":
            with fsspec.open(path, "rb") as f:
                parquet = pq.ParquetFile(f)
                schema, rows = parquet.schema_arrow, parquet.metadata.num_rows
        else:
            schema, rows = _scan_text_input(path, fmt)
    except FileNotFoundError:
        raise IngestInputError(f"{path}: no such input file") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise IngestInputError(f"{path}: not a readable {fmt} file ({exc})") from None
    _check_columns(path, schema, config)
    if rows == 0:
        raise IngestInputError(f"{path}: the file has no rows")
    return rows


def _scan_text_input(path: str, fmt: str) -> tuple[pa.Schema, int]:
    with fsspec.open(path, "rb") as f:
        reader = pa_json.open_json(f) if fmt == "jsonl" else pa_csv.open_csv(f)
        rows = sum(batch.num_rows for batch in reader)
        return reader.schema, rows


def _check_columns(path: str, schema: pa.Schema, config: IngestConfig) -> None:
    images = config.download_images
    wanted = {
        "url_col": (images.url_col, _is_text),
        "image_bytes_col": (images.image_bytes_col, _is_bytes),
        "caption_col": (images.caption_col, lambda t: _is_text(t) or _is_bytes(t)),
        "captions_json_col": (images.captions_json_col, _is_text),
    }
    wanted.update({f"save_additional_columns[{c}]": (c, lambda t: True) for c in images.save_additional_columns})
    for setting, (column, type_ok) in wanted.items():
        if not column:
            continue
        if column not in schema.names:
            raise IngestInputError(
                f"{path}: column {column!r} (download_images.{setting}) is missing; the file has {schema.names}"
            )
        kind = schema.field(column).type
        if not type_ok(kind):
            raise IngestInputError(f"{path}: column {column!r} (download_images.{setting}) has type {kind}")


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)


def _is_bytes(kind: pa.DataType) -> bool:
    if pa.types.is_struct(kind):  # Hugging Face's Image feature: struct<bytes: binary, path: string>
        return kind.get_field_index("bytes") >= 0 and _is_bytes(kind.field("bytes").type)
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_null(kind)


def split_rows(rows: int, config: IngestConfig) -> list[tuple[int, int]]:
    """Row ranges of one file: `parquet_subpartitions` equal parts, else `rows_per_unit` rows each."""
    stage = config.download_parquet
    if stage.parquet_subpartitions:
        parts = max(stage.parquet_subpartitions, -(-rows // MAX_ROWS_PER_UNIT))
        bounds = [rows * i // parts for i in range(parts + 1)]
    else:
        bounds = [*range(0, rows, stage.rows_per_unit), rows]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def plan_units(config: IngestConfig, previous: list[WorkUnit]) -> list[WorkUnit]:
    """Units for every input: the previous plan's units unchanged, new files' units appended."""
    files = list_inputs(config.download_parquet.parquet_pattern)
    if config.download_parquet.copy_inputs:
        files = copy_inputs(files, config.dataset_output_root)
    by_file: dict[str, list[WorkUnit]] = {}
    for unit in previous:
        by_file.setdefault(unit.file, []).append(unit)
    units = list(previous)
    for path in files:
        rows = inspect_input(path, config)
        if path in by_file:
            planned = max(u.stop for u in by_file[path])
            if planned != rows:
                raise IngestInputError(
                    f"{path}: has {rows} rows but was planned with {planned}; an ingested input must not change "
                    "(write new data to a new file, or use a new dataset_output_root)"
                )
            continue
        for start, stop in split_rows(rows, config):
            units.append(WorkUnit(len(units), path, start, stop))
    if len(units) > 99_999:
        raise IngestInputError(f"{len(units)} work units exceed the 5-digit shard ids; raise rows_per_unit")
    return units


def copy_inputs(files: list[str], root: str) -> list[str]:
    """Copies of the inputs under `<root>/inputs/`; an existing copy of the same size is reused."""
    targets = {}
    for source in files:
        target = f"{root.rstrip('/')}/inputs/{storage.basename(source)}"
        if target in targets.values():
            raise IngestInputError(f"two inputs are named {storage.basename(source)}; copy_inputs needs unique names")
        targets[source] = target
    for source, target in targets.items():
        source_fs, source_path = fsspec.core.url_to_fs(source)
        if not storage.exists(target) or storage.size(target) != source_fs.size(source_path):
            storage.copy_atomic(source, target)
    return sorted(targets.values())


def read_plan(root: str) -> list[WorkUnit]:
    path = f"{root.rstrip('/')}/{PLAN_FILE}"
    if not storage.exists(path):
        return []
    return [WorkUnit(**u) for u in json.loads(storage.read_text(path))["units"]]


def write_plan(root: str, units: list[WorkUnit]) -> None:
    body = json.dumps({"version": 1, "units": [asdict(u) for u in units]}, indent=1, sort_keys=True)
    storage.write_bytes_atomic(f"{root.rstrip('/')}/{PLAN_FILE}", body.encode())
