"""Stage 2, download_images: one work unit -> one raw shard with img2dataset's contract.

    raw/NNNNN.tar          <key>.jpg, <key>.txt, <key>.json per successful row, keys NNNNN + 4-digit row
                           (with an `ingest.video` section: <key>.mp4, made by videos.py instead of images.py)
    raw/NNNNN.parquet      one row per input row, failures included: status, skip_reason, error_message, ...
    raw/NNNNN_stats.json   counts and the skip-reason histogram; written LAST: it is the unit's commit record

Rows stream from the input in batches; fetching and transforming run on a thread pool and finish in completion
order, so a slow or dead host holds up only its own row (no head-of-line blocking). Finished rows wait in a bounded
reorder buffer and are written in input order, so the shard's bytes do not depend on which host was slow
(ordered_map). A unit of at least `error_budget_min_rows` rows is committed only if its skip rate is within the
error budget; otherwise it fails with the reason histogram and nothing is written under a final name (the dataset
as a whole is judged before reorganize_tar: budget.py). Error messages are stable across runs (no memory
addresses), so two runs over the same input write the same parquet and the same `status_dict`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq

from unirl_core.config.ingest import DownloadImagesConfig, IngestConfig, VideoIngestConfig
from unirl_core.ingest.budget import judge_unit
from unirl_core.ingest.fetch import Fetcher, FetchError, FetchPolicy
from unirl_core.ingest.images import ImageOptions, SkipSample, process_image
from unirl_core.ingest.plan import IngestInputError, WorkUnit, input_schema, iter_rows
from unirl_core.ingest.videos import VideoOptions, process_video, require_av
from unirl_core.io import storage
from unirl_core.io.tars import TarShardWriter

DOWNLOAD_REASONS = {"failed_to_download", "blocked_scheme", "blocked_address", "too_large", "no_image"}
# Settings that never change a unit's output: a re-run may change them and still reuse committed units.
NON_OUTPUT_SETTINGS = {
    "enable",
    "download_num_processes",
    "download_num_threads",
    "connect_timeout_s",
    "read_timeout_s",
    "total_timeout_s",
    "retries",
    "retry_backoff_s",
    "error_budget",
    "error_budget_min_rows",
}
# `<_io.BytesIO object at 0x7f...>` in Pillow's and urllib3's messages: differs on every run
MEMORY_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# Rows queued or running per fetch thread: enough to keep every thread busy, few enough to stay cheap.
RUNNING_PER_THREAD = 2
# Rows a unit may run ahead of its oldest unwritten row, per fetch thread. Finished rows wait in memory (an encoded
# output image plus its record, ~30 KB at 256 px) until every earlier row is done, so this bounds that memory:
# 16 threads -> 1024 rows (~30 MB). It also bounds the stall: the buffer fills only when the oldest row is slower
# than the time the unit needs for 64 x threads rows (at 16 threads and ~150 rows/s, about 7 s; a 3 s host and a
# 5 s timeout fit).
AHEAD_PER_THREAD = 64
# Marks the stats `download_unit` returns for a unit it committed itself (not one committed before): the flow counts
# the units this run added from it, even those a head start (workers.py) committed before the flow began.
COMMITTED_NOW = "committed_now"
_END = object()


@dataclass
class RowResult:
    row: dict  # the per-row parquet record
    members: dict[str, bytes] | None  # the sample's tar members, None when skipped


def output_fingerprint(config: DownloadImagesConfig, video: VideoIngestConfig | None = None) -> str:
    """Identity of the settings that shape a unit's output (so a re-run never mixes two settings' outputs). An
    image dataset's (no `video` section) is what it was before video existed."""
    settings = config.model_dump(mode="json", exclude=NON_OUTPUT_SETTINGS)
    if video is not None:
        settings["video"] = video.model_dump(mode="json")
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def raw_paths(root: str, unit: WorkUnit) -> dict[str, str]:
    base = f"{root.rstrip('/')}/raw/{unit.name}"
    return {"tar": f"{base}.tar", "parquet": f"{base}.parquet", "stats": f"{base}_stats.json"}


def committed_stats(root: str, unit: WorkUnit, config: IngestConfig) -> dict | None:
    """The unit's stats if it was committed with the same unit and settings; None if not committed yet."""
    path = raw_paths(root, unit)["stats"]
    if not storage.exists(path):
        return None
    stats = json.loads(storage.read_text(path))
    expected = {"file": unit.file, "start": unit.start, "stop": unit.stop}
    settings = output_fingerprint(config.download_images, config.video)
    if stats.get("unit") != expected or stats.get("settings") != settings:
        raise IngestInputError(
            f"{path} was committed for {stats.get('unit')} with settings {stats.get('settings')}, but this run plans "
            f"{expected} with settings {settings}; use a new dataset_output_root "
            "or delete the raw/ folder to rebuild"
        )
    return stats


def download_unit(
    root: str,
    unit: WorkUnit,
    config: IngestConfig,
    on_row: Callable[[int], None] | None = None,
    on_input_done: Callable[[], None] | None = None,
) -> dict:
    """Process one unit into its raw shard (or return its committed stats; the stats of a unit this call committed
    carry COMMITTED_NOW, never written). Raises budget.ErrorBudgetExceeded.
    `on_row(n)`: n more rows done; `on_input_done()`: every row has started, only the last ones are still running
    (a slow or dead host among them can take up to its timeout: workers.py starts the next unit then)."""
    done = committed_stats(root, unit, config)
    if done is not None:
        if on_row:
            on_row(done["count"])
        return done
    stage = config.download_images
    paths, started = raw_paths(root, unit), time.time()
    storage.remove_temporaries(f"{root.rstrip('/')}/raw", unit.name)  # a killed run's tar/parquet/stats
    records, reasons = [], Counter()
    with TarShardWriter(paths["tar"]) as writer, ThreadPoolExecutor(stage.download_num_threads) as pool:
        worker = _RowWorker(unit, stage, config.video)
        running, ahead = RUNNING_PER_THREAD * stage.download_num_threads, AHEAD_PER_THREAD * stage.download_num_threads
        rows = ordered_map(pool, worker, _iter_rows(unit, stage), running, ahead, on_exhausted=on_input_done)
        for result in rows:
            records.append(result.row)
            if result.members is None:
                reasons[result.row["skip_reason"]] += 1
            else:
                writer.write(result.row["key"], result.members)
            if on_row:
                on_row(1)
        judge_unit(f"unit {unit.name} ({unit.file} rows {unit.start}-{unit.stop})", len(records), reasons, stage)
        shard = writer.commit()
    _write_parquet(paths["parquet"], records, _row_schema(unit, stage, config.video))
    stats = _stats(unit, config, records, reasons, shard, started)
    with storage.permanent_errors_name(paths["stats"]):
        storage.write_bytes_atomic(paths["stats"], json.dumps(stats, indent=1, sort_keys=True).encode())
    return {**stats, COMMITTED_NOW: True}


def ordered_map(
    pool: ThreadPoolExecutor,
    fn: Callable,
    items: Iterable,
    max_running: int,
    max_ahead: int,
    on_exhausted: Callable[[], None] | None = None,
) -> Iterator:
    """`pool.map` in input order, computed in completion order (a slow item holds up only itself).

    At most `max_running` items are queued or running. A finished item waits in a reorder buffer until every earlier
    item is yielded; the newest submitted item is at most `max_ahead` positions past the oldest unyielded one, so the
    buffer holds fewer than `max_ahead` results: when the oldest item is slow, later ones finish and wait until the
    span reaches `max_ahead`, then submission pauses until the oldest finishes. Memory stays bounded on long inputs.
    An item's exception is raised in its turn, as `pool.map` does. `on_exhausted()` is called once, when the last
    item has been submitted.
    """
    assert 0 < max_running <= max_ahead
    items = iter(items)
    running: dict[Future, int] = {}  # future -> input position
    finished: dict[int, Future] = {}  # the reorder buffer: done, waiting for an earlier position
    submitted = yielded = 0
    while True:
        while len(running) < max_running and submitted - yielded < max_ahead:
            item = next(items, _END)
            if item is _END:
                if on_exhausted is not None:
                    on_exhausted()
                    on_exhausted = None
                break
            running[pool.submit(fn, item)] = submitted
            submitted += 1
        if not running:  # the input is exhausted and every result yielded (the oldest is never left in `finished`)
            return
        done, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            finished[running.pop(future)] = future
        while yielded in finished:
            yield finished.pop(yielded).result()
            yielded += 1


def _iter_rows(unit: WorkUnit, stage: DownloadImagesConfig) -> Iterator[tuple[int, dict]]:
    columns = [c for c in (stage.url_col, stage.image_bytes_col, stage.caption_col, stage.captions_json_col) if c]
    columns += [c for c in stage.save_additional_columns if c not in columns]
    text = tuple(c for c in (stage.url_col, stage.caption_col, stage.captions_json_col) if c)
    yield from iter_rows(unit.file, columns, unit.start, unit.stop, text_columns=text)


class _RowWorker:
    """Turns one input row into a RowResult; runs on the unit's thread pool."""

    def __init__(self, unit: WorkUnit, stage: DownloadImagesConfig, video: VideoIngestConfig | None = None):
        self.unit, self.stage, self.video = unit, stage, video
        self.fetcher = Fetcher(
            FetchPolicy(
                connect_timeout_s=stage.connect_timeout_s,
                read_timeout_s=stage.read_timeout_s,
                total_timeout_s=stage.total_timeout_s,
                retries=stage.retries,
                retry_backoff_s=stage.retry_backoff_s,
                max_redirects=stage.max_redirects,
                max_bytes=stage.max_bytes if video is None else video.max_bytes,
                allow_local_files=stage.allow_local_files,
                allowed_private_networks=tuple(stage.allowed_private_networks),
                allowed_schemes=tuple(stage.allowed_url_schemes),
            ),
            pool_size=stage.download_num_threads,
        )
        self.options = ImageOptions(
            resize_mode=stage.resize_mode,
            image_size=stage.image_size,
            resize_only_if_bigger=stage.resize_only_if_bigger,
            min_image_size=stage.min_image_size,
            max_image_area=stage.max_image_area,
            max_aspect_ratio=stage.max_aspect_ratio,
            encode_format=stage.encode_format,
            encode_quality=stage.encode_quality,
            max_pixels=stage.max_pixels,
            downscale_filter=stage.downscale_filter,
        )
        if video is not None:
            require_av()
            options = VideoOptions(video.max_seconds, stage.max_pixels, tuple(video.formats), video.crf)
            self.process, self.extension = functools.partial(process_video, options=options), "mp4"
        else:
            self.process = functools.partial(process_image, options=self.options)
            self.extension = stage.encode_format

    def __call__(self, item: tuple[int, dict]) -> RowResult:
        position, raw = item
        key = f"{self.unit.name}{position - self.unit.start:04d}"
        url = raw.get(self.stage.url_col) if self.stage.url_col else None
        row = {"key": key, "url": url, "source_file": self.unit.file, "source_row": position}
        row.update({c: raw.get(c) for c in self.stage.save_additional_columns})
        try:
            caption, captions = self._caption(raw)
            row["caption"] = caption
            media = self.process(self._image_bytes(raw, url))
        except (SkipSample, FetchError) as exc:
            return self._skipped(row, exc.reason, str(exc))
        except Exception as exc:  # a row must never fail its unit: record it, count it, go on
            if storage.is_permanent(exc):  # ... but a full or read-only disk is not the row's fault
                raise
            return self._skipped(row, "processing_error", f"{type(exc).__name__}: {exc}")
        row.update(status="success", skip_reason=None, error_message=None)
        row.update(media.row_fields())
        meta = {k: v for k, v in row.items() if _json_safe(v)}
        if captions is not None:
            meta["captions"] = captions
        members = {
            self.extension: media.data,
            "txt": caption.encode("utf-8"),
            "json": json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8"),
        }
        return RowResult(row, members)

    def _skipped(self, row: dict, reason: str, message: str) -> RowResult:
        status = "failed_to_download" if reason in DOWNLOAD_REASONS else "failed_to_resize"
        row.update(status=status, skip_reason=reason, error_message=MEMORY_ADDRESS.sub("", message)[:500])
        row.setdefault("caption", None)
        return RowResult(_with_media_fields(row, self.video), None)

    def _image_bytes(self, raw: dict, url: str | None) -> bytes:
        data = raw.get(self.stage.image_bytes_col) if self.stage.image_bytes_col else None
        if isinstance(data, dict):  # Hugging Face Image feature
            data = data.get("bytes")
        if data:
            return data  # bytes win over a URL in the same row: no fetch
        if isinstance(url, str) and url.strip():
            return self.fetcher.fetch(url.strip())  # an empty body is a decode_error (process_image)
        if data is not None and self.video is not None:
            return data  # empty: process_video skips it as not_a_video
        if data is not None:
            raise SkipSample("decode_error", "the image bytes are empty (0 bytes) and the row has no URL")
        raise SkipSample("no_image", "the row has neither image bytes nor a URL")

    def _caption(self, raw: dict) -> tuple[str, dict | None]:
        captions = None
        if self.stage.captions_json_col:
            text = raw.get(self.stage.captions_json_col)
            try:
                captions = json.loads(text) if text else {}
            except json.JSONDecodeError as exc:
                raise SkipSample("bad_caption", f"captions JSON is invalid: {exc}") from None
            if not isinstance(captions, dict):
                raise SkipSample("bad_caption", "captions JSON is not an object")
            caption = str(captions[min(captions, key=_caption_order)]) if captions else ""
        else:
            caption = raw.get(self.stage.caption_col) if self.stage.caption_col else ""
        caption = "" if caption is None else caption
        if isinstance(caption, bytes):
            try:
                caption = caption.decode("utf-8")
            except UnicodeDecodeError:
                raise SkipSample("bad_caption", "caption is not valid UTF-8") from None
        if not isinstance(caption, str):
            raise SkipSample("bad_caption", f"caption is a {type(caption).__name__}, not text")
        try:
            size = len(caption.encode("utf-8"))
        except UnicodeEncodeError:
            raise SkipSample("bad_caption", "caption holds a lone surrogate, not valid Unicode text") from None
        if size > self.stage.max_caption_bytes:
            raise SkipSample("bad_caption", f"caption longer than max_caption_bytes {self.stage.max_caption_bytes}")
        if self.stage.skip_empty_captions and not caption.strip():
            raise SkipSample("empty_caption", "caption is empty")
        return caption, captions


def _caption_order(key: str) -> tuple[int, str]:
    return (int(key), key) if key.isdigit() else (1 << 62, key)


def _json_safe(value) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


def _with_media_fields(row: dict, video: VideoIngestConfig | None) -> dict:
    for field in ("width", "height", "original_width", "original_height", "sha256"):
        row.setdefault(field, None)
    for field, _ in VIDEO_FIELDS if video is not None else ():
        row.setdefault(field, None)
    return row


ROW_FIELDS = [
    ("key", pa.string()),
    ("url", pa.string()),
    ("source_file", pa.string()),
    ("source_row", pa.int64()),
    ("caption", pa.string()),
    ("status", pa.string()),
    ("skip_reason", pa.string()),
    ("error_message", pa.string()),
    ("width", pa.int64()),
    ("height", pa.int64()),
    ("original_width", pa.int64()),
    ("original_height", pa.int64()),
    ("sha256", pa.string()),
]
VIDEO_FIELDS = [
    ("duration", pa.float64()),
    ("fps", pa.float64()),
    ("num_frames", pa.int64()),
    ("source_format", pa.string()),
]  # fmt: skip  (video datasets only: an image parquet is unchanged)


def _row_schema(unit: WorkUnit, stage: DownloadImagesConfig, video: VideoIngestConfig | None = None) -> pa.Schema:
    """The same columns and types in every unit's parquet, so readers can concatenate them."""
    fields = [pa.field(name, kind) for name, kind in ROW_FIELDS + (VIDEO_FIELDS if video is not None else [])]
    if stage.save_additional_columns:
        source = input_schema(unit.file)
        fields += [source.field(c) for c in stage.save_additional_columns if c not in dict(ROW_FIELDS)]
    return pa.schema(fields)


def _write_parquet(path: str, records: list[dict], schema: pa.Schema) -> None:
    table = pa.Table.from_pylist(records, schema=schema)  # every record has every field (_with_media_fields)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    with storage.permanent_errors_name(path):  # local writes name it already; object stores and pyarrow do not
        storage.write_bytes_atomic(path, sink.getvalue().to_pybytes())


def _stats(unit, config: IngestConfig, records, reasons, shard, started) -> dict:
    ended = time.time()
    statuses = Counter(r["status"] for r in records)
    return {
        "count": len(records),
        "successes": statuses["success"],
        "failed_to_download": statuses["failed_to_download"],
        "failed_to_resize": statuses["failed_to_resize"],
        "duration": round(ended - started, 3),
        "start_time": datetime.fromtimestamp(started, UTC).isoformat(),
        "end_time": datetime.fromtimestamp(ended, UTC).isoformat(),
        "status_dict": dict(Counter(r["error_message"] for r in records if r["error_message"])),
        "skip_reasons": dict(sorted(reasons.items())),
        "unit": {"file": unit.file, "start": unit.start, "stop": unit.stop},
        "settings": output_fingerprint(config.download_images, config.video),
        "tar": {
            "name": shard.name,
            "nsamples": shard.nsamples,
            "filesize": shard.filesize,
            "sha256": shard.sha256,
            "md5": shard.md5,
        },
    }
