"""Stage 1, download_parquet: find the inputs, check them, and split them into work units (file x row range).

Every input is opened and its columns checked before any download: a missing column, a wrong type, an empty file
or a corrupt footer is an `IngestInputError` naming the file (permanent: never retried). The plan is committed as
`units.json` and only ever grows: a re-run keeps every unit's number, and files that landed since get new units
after the last one, so their keys sort after every committed sample and existing full shards stay byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import fsspec
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from unirl_core.config.ingest import MAX_ROWS_PER_UNIT, IngestConfig
from unirl_core.errors import UserError
from unirl_core.io import storage

logger = logging.getLogger(__name__)

PLAN_FILE = "units.json"
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


class IngestInputError(UserError, ValueError):
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


def open_batches(
    path: str, columns: list[str] | None, batch_size: int = 256, text_columns: tuple[str, ...] = ()
) -> Iterator[pa.RecordBatch]:
    """Stream record batches of `columns` from a parquet, jsonl or csv file (never the whole file in memory).
    `text_columns` are read as strings from csv/jsonl (a caption column of digits is still text)."""
    fmt = input_format(path)
    with fsspec.open(path, "rb") as f:
        if fmt == "parquet":
            yield from pq.ParquetFile(f).iter_batches(batch_size=batch_size, columns=columns)
        elif fmt == "jsonl":
            schema = pa.schema([(c, pa.string()) for c in text_columns])
            parse = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
            reader = pa_json.open_json(f, read_options=pa_json.ReadOptions(block_size=1 << 20), parse_options=parse)
            for batch in reader:
                yield batch if columns is None else batch.select(columns)
        else:
            convert = pa_csv.ConvertOptions(
                include_columns=columns, column_types=dict.fromkeys(text_columns, pa.string())
            )
            yield from pa_csv.open_csv(f, convert_options=convert)


def iter_rows(
    path: str, columns: list[str], start: int, stop: int, text_columns: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict]]:
    """(row number, row) for rows [start, stop). Parquet seeks to the first row group holding `start`, so a unit
    reads only its own row groups; csv/jsonl stream from the top."""
    if input_format(path) == "parquet":
        with fsspec.open(path, "rb") as f:
            parquet = pq.ParquetFile(f)
            groups, position, first = [], 0, None
            for i in range(parquet.metadata.num_row_groups):
                rows = parquet.metadata.row_group(i).num_rows
                if position + rows > start and position < stop:
                    groups.append(i)
                    first = position if first is None else first
                position += rows
            batches = parquet.iter_batches(batch_size=256, columns=columns, row_groups=groups) if groups else []
            yield from _rows_in_range(batches, first or 0, start, stop)
    else:
        yield from _rows_in_range(open_batches(path, columns, text_columns=text_columns), 0, start, stop)


def _rows_in_range(batches, position: int, start: int, stop: int) -> Iterator[tuple[int, dict]]:
    for batch in batches:
        if position + batch.num_rows <= start:
            position += batch.num_rows
            continue
        for row in batch.to_pylist():
            if position >= start:
                yield position, row
            position += 1
            if position >= stop:
                return


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
            schema, rows = _scan_text_input(path, text_columns(config))
    except FileNotFoundError:
        raise IngestInputError(f"{path}: no such input file") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise IngestInputError(f"{path}: not a readable {fmt} file ({exc})") from None
    _check_columns(path, schema, config)
    if rows == 0:
        raise IngestInputError(f"{path}: the file has no rows")
    return rows


def _scan_text_input(path: str, text: tuple[str, ...]) -> tuple[pa.Schema, int]:
    schema, rows = None, 0
    for batch in open_batches(path, None, batch_size=4096, text_columns=text):
        schema, rows = schema or batch.schema, rows + batch.num_rows
    if schema is None:
        raise pa.ArrowInvalid("empty file")
    return schema, rows


def text_columns(config: IngestConfig) -> tuple[str, ...]:
    images = config.download_images
    return tuple(c for c in (images.url_col, images.caption_col, images.captions_json_col) if c)


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


@dataclass
class Plan:
    units: list[WorkUnit] = field(default_factory=list)
    files: dict[str, dict] = field(default_factory=dict)  # input -> {"rows", "size", "sample_sha256"}


def file_identity(path: str, rows: int) -> dict:
    """Rows, size and a hash of the first and last 64 KiB (parquet's footer): enough to notice a changed input
    without reading it all."""
    fs, fs_path = fsspec.core.url_to_fs(path)
    size = fs.size(fs_path)
    with fs.open(fs_path, "rb") as f:
        head = f.read(65536)
        f.seek(max(0, size - 65536))
        tail = f.read(65536)
    return {"rows": rows, "size": size, "sample_sha256": hashlib.sha256(head + tail).hexdigest()}


def plan_units(config: IngestConfig, previous: Plan) -> Plan:
    """The previous plan's units unchanged, new files' units appended. A planned input that changed, or a new
    input identical to a planned one (a copy, a rename), is an error: the dataset would mix or double rows."""
    files = list_inputs(config.download_parquet.parquet_pattern)
    if config.download_parquet.copy_inputs:
        files = copy_inputs(files, config.dataset_output_root)
    plan = Plan(list(previous.units), dict(previous.files))
    known = {json.dumps(identity, sort_keys=True): path for path, identity in previous.files.items()}
    for path in files:
        identity = file_identity(path, inspect_input(path, config))
        if path in previous.files:
            if previous.files[path] != identity:
                raise IngestInputError(
                    f"{path} changed since it was ingested ({previous.files[path]} then, {identity} now); an ingested "
                    "input must not change: write new data to a new file, or use a new dataset_output_root"
                )
            continue
        twin = known.get(json.dumps(identity, sort_keys=True))
        if twin is not None:
            raise IngestInputError(f"{path} has the same content as {twin}, which is already ingested")
        plan.files[path] = identity
        for start, stop in split_rows(identity["rows"], config):
            plan.units.append(WorkUnit(len(plan.units), path, start, stop))
    missing = sorted(set(previous.files) - set(files))
    if missing:
        logger.warning("inputs no longer matched by parquet_pattern keep their committed units: %s", missing)
    if len(plan.units) > 99_999:
        raise IngestInputError(f"{len(plan.units)} work units exceed the 5-digit shard ids; raise rows_per_unit")
    return plan


def copy_inputs(files: list[str], root: str) -> list[str]:
    """Copies of the inputs under `<root>/inputs/`; an existing copy of the same size is reused."""
    targets = {}
    for source in files:
        target = f"{root.rstrip('/')}/inputs/{storage.basename(source)}"
        if target in targets.values():
            raise IngestInputError(f"two inputs are named {storage.basename(source)}; copy_inputs needs unique names")
        targets[source] = target
    for source, target in targets.items():
        if not storage.exists(target) or file_identity(target, 0) != file_identity(source, 0):
            storage.copy_atomic(source, target)
    return sorted(targets.values())


def read_plan(root: str) -> Plan:
    path = f"{root.rstrip('/')}/{PLAN_FILE}"
    if not storage.exists(path):
        return Plan()
    stored = json.loads(storage.read_text(path))
    return Plan([WorkUnit(**u) for u in stored["units"]], stored["files"])


def write_plan(root: str, plan: Plan) -> None:
    stored = {"version": 1, "units": [asdict(u) for u in plan.units], "files": plan.files}
    body = json.dumps(stored, indent=1, sort_keys=True)
    storage.write_bytes_atomic(f"{root.rstrip('/')}/{PLAN_FILE}", body.encode())
