"""The `ingest` recipe section: NeMo's data-preparation stages, with NeMo's field names where NeMo has one.

    ingest:
      dataset_output_root: s3://bucket/datasets/laion-mini   # empty: $UNIRL_HOME/data/<recipe name>
      download_parquet: {parquet_pattern: "data/*.parquet", rows_per_unit: 1000}
      download_images:  {url_col: url, caption_col: caption, resize_mode: center_crop, image_size: 512}
      reorganize_tar:   {tar_chunk_size: 1000}
      generate_wdinfo:  {enable: true}

With a `video` section the rows hold videos (mp4, mov, webm) instead of images, in the same columns:

    ingest:
      download_images: {url_col: url, image_bytes_col: video, caption_col: caption}
      video: {max_seconds: 30, max_bytes: 268435456}

Layout under `dataset_output_root`: `units.json` (the work plan), `raw/` (one img2dataset-style shard per work unit:
`NNNNN.tar`, `NNNNN.parquet`, `NNNNN_stats.json` written last), `shards/` (exactly `tar_chunk_size` samples per
tar, the tail marked `.INCOMPLETE`, `wdinfo.pkl` and `index.json`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from unirl_core.config.schema_base import Count, OptionalStr, Problem, StrictModel

MAX_ROWS_PER_UNIT = 10_000  # keys are 5 digits of unit + 4 digits of row, as img2dataset's
# Fields every row record and sample JSON carries; input columns cannot be saved under these names.
RESERVED_ROW_FIELDS = (
    "key", "url", "source_file", "source_row", "caption", "captions", "status", "skip_reason", "error_message",
    "width", "height", "original_width", "original_height", "sha256",
)  # fmt: skip


class DownloadParquetConfig(StrictModel):
    """Stage 1: find the input files and split them into work units (file x row range)."""

    enable: bool = True
    """Run this stage. Disabled: `units.json` from an earlier run is used."""

    parquet_pattern: list[str] = []
    """Input files: paths, globs or fsspec URLs (`s3://bucket/part-*.parquet`, `hf://datasets/org/name/*.parquet`).
    Parquet, and `.jsonl` / `.csv` read through pyarrow."""

    rows_per_unit: Annotated[Count, Field(ge=1, le=MAX_ROWS_PER_UNIT)] = 1000
    """Rows per work unit (one raw shard, one Prefect task). At most 10,000 (4-digit row part of the key)."""

    parquet_subpartitions: Annotated[Count, Field(ge=1)] | None = None
    """NeMo's split: cut each file into this many units instead (each still at most 10,000 rows)."""

    copy_inputs: bool = False
    """Copy the inputs into `<dataset_output_root>/inputs/` first (streamed, atomic) and read them from there: the
    dataset keeps its own copy of what it was built from (NeMo downloads the parquet files into the root)."""

    @field_validator("parquet_pattern", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class DownloadImagesConfig(StrictModel):
    """Stage 2: per work unit, fetch (guarded), decode, transform and write a raw shard (img2dataset's contract)."""

    enable: bool = True
    """Run this stage. Disabled: the raw shards of an earlier run are used."""

    url_col: OptionalStr = "url"
    """Column with the image URL (http, https or s3). Empty: images come only from `image_bytes_col`."""

    image_bytes_col: OptionalStr = None
    """Column with the encoded image bytes (or Hugging Face's Image struct). When a row has both bytes and a URL, the
    bytes are used (no fetch). Empty bytes (0 bytes) fall back to the URL; with no URL they are a `decode_error`,
    as an empty URL body is (`no_image` is for a row with neither)."""

    caption_col: OptionalStr = "caption"
    """Column with the caption text. A null caption is stored as an empty caption."""

    captions_json_col: OptionalStr = None
    """Column with a JSON object of captions (BAGEL's t2i parquet: {"0": "...", "1": "..."}): the first (by key)
    becomes the caption, all are kept in the sample's JSON."""

    save_additional_columns: list[str] = []
    """Extra input columns copied into each sample's JSON and the per-shard parquet."""

    download_num_processes: Annotated[Count, Field(ge=1)] = 2
    """Global: worker processes taking rows at the same time, one work unit each (img2dataset's `processes_count`;
    about one per core). A unit whose rows have all started lets the next one start in another process while its
    last rows finish, so up to twice as many units (and processes) are open at once."""

    download_num_threads: Annotated[Count, Field(ge=1)] = 16
    """Per unit: fetch-and-transform threads."""

    connect_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    """Seconds to establish a connection, per attempt."""

    read_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    """Seconds of silence tolerated while reading a response, per attempt."""

    total_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    """Seconds one attempt may take in all (a server trickling bytes cannot hold a thread forever)."""

    retries: Annotated[Count, Field(ge=0)] = 2
    """Extra attempts per URL after a transient failure (connection error, timeout, 5xx, 429), with exponential
    backoff and jitter. A 404 or a blocked address is never retried."""

    retry_backoff_s: Annotated[float, Field(ge=0)] = 0.5
    """Base backoff in seconds: attempt n waits base x 2^n x (1 + jitter in [0, 1))."""

    max_redirects: Annotated[Count, Field(ge=0)] = 5
    """Redirect hops followed per URL; each hop's scheme and address are checked again."""

    max_bytes: Annotated[Count, Field(ge=1)] = 32 * 1024 * 1024
    """Largest response body in bytes; a longer (or endless) body is skipped as `too_large`, read stops there."""

    max_pixels: Annotated[Count, Field(ge=1)] = 89_478_485
    """Largest width x height decoded (decided from the header, before decoding); larger is `too_many_pixels`."""

    allow_local_files: bool = False
    """Accept `file://` URLs and plain paths in the URL column (tests, local mirrors). Off: `blocked_scheme`."""

    allowed_url_schemes: list[Literal["http", "https", "s3"]] = ["http", "https", "s3"]
    """URL schemes fetched. `s3` rows are read with this run's own credentials: drop it when URLs come from
    untrusted sources and the role can read objects that must not end up in a dataset."""

    allowed_private_networks: list[str] = []
    """Networks (CIDR) exempt from the address guard, for tests and private mirrors (`["10.0.0.0/8"]`). Any other
    loopback, private, link-local or reserved address is `blocked_address`, checked before connecting and again on
    the connected socket, at every redirect hop."""

    @field_validator("allowed_private_networks")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        import ipaddress

        for network in value:
            ipaddress.ip_network(network, strict=False)  # ValueError names the bad entry
        return value

    resize_mode: Literal["no", "border", "keep_ratio", "keep_ratio_largest", "center_crop"] = "border"
    """img2dataset's modes: `keep_ratio` (short side = image_size), `keep_ratio_largest` (long side = image_size),
    `center_crop` (short side, then a centered square), `border` (long side, then padded to a white square), `no`."""

    image_size: Annotated[Count, Field(ge=1)] = 256
    """Target size in pixels for the resize mode."""

    downscale_filter: Literal["area", "bicubic", "lanczos"] = "area"
    """Filter when shrinking: `area` (pixel averaging, OpenCV's INTER_AREA that img2dataset uses; fastest),
    `bicubic`, `lanczos` (sharpest, about 4x the cost of `area`). Upscaling always uses Lanczos."""

    resize_only_if_bigger: bool = False
    """Never upscale: images already within `image_size` keep their size (and, when possible, their bytes)."""

    min_image_size: Annotated[Count, Field(ge=0)] = 0
    """Skip images whose short side (pixels) is below this, as `image_too_small`."""

    max_image_area: Annotated[float, Field(gt=0)] | None = None
    """Skip images with more than this many pixels (width x height), as `image_too_large`."""

    max_aspect_ratio: Annotated[float, Field(ge=1)] | None = None
    """Skip images whose long/short side ratio exceeds this, as `bad_aspect_ratio`."""

    encode_format: Literal["jpg", "png", "webp"] = "jpg"
    """Stored image format (the member extension). Original bytes are kept when nothing needs re-encoding."""

    encode_quality: Annotated[Count, Field(ge=1, le=100)] = 95
    """JPEG/WebP quality."""

    max_caption_bytes: Annotated[Count, Field(ge=1)] = 65_536
    """Longest caption in UTF-8 bytes; longer (or not valid UTF-8) is skipped as `bad_caption`."""

    skip_empty_captions: bool = False
    """Skip rows whose caption is null or empty (as `empty_caption`) instead of storing an empty caption."""

    error_budget: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Largest fraction of rows that may be skipped; above it the run fails with the reason histogram instead of
    shipping an empty dataset. Judged per unit (units of at least `error_budget_min_rows` rows) and over the whole
    dataset; see `error_budget_min_rows`."""

    error_budget_min_rows: Annotated[Count, Field(ge=1)] = 100
    """Fewest rows a unit must have to be judged against `error_budget` on its own. The rule:

    - a unit of at least this many rows whose skip rate is over the budget fails as soon as it is processed, and
      is not committed (a bad input fails early, not after the whole dataset is downloaded);
    - a smaller unit (the tail of a file, `rows_per_unit` below this) is committed whatever its rate: 2 bad rows
      of a 2-row unit say nothing about the dataset, so 3,000 good rows and 2 bad ones at the end pass;
    - before `reorganize_tar` writes any shard, the skip rate of all units together is judged against the budget,
      so a dataset that is bad as a whole (100% bad in units of 10 rows, say) still fails, with nothing shipped.
      Committed units are kept: a re-run with a larger `error_budget` or more inputs reuses them.

    1 judges every unit on its own (a 1-row unit can then fail the run). With `rows_per_unit` below this value no
    unit is judged on its own: a bad dataset is found only when all its units are done."""

    def problems(self):
        reserved = sorted(set(self.save_additional_columns) & set(RESERVED_ROW_FIELDS))
        if reserved:
            yield (
                "save_additional_columns",
                reserved,
                f"columns named like unirl's own row fields {list(RESERVED_ROW_FIELDS)} cannot be saved; rename them in the input",
            )
        if not (self.url_col or self.image_bytes_col):
            yield "url_col", self.url_col, "set url_col or image_bytes_col: images must come from somewhere"
        if self.caption_col and self.captions_json_col:
            yield "captions_json_col", self.captions_json_col, "set caption_col or captions_json_col, not both"


VIDEO_FORMATS = ("mp4", "mov", "webm")
VIDEO_ROW_FIELDS = ("duration", "fps", "num_frames", "source_format")  # row and sample-JSON fields of a video


class VideoIngestConfig(StrictModel):
    """Video rows: `download_images.url_col` / `image_bytes_col` hold video files (mp4, mov, webm) instead of images.

    Each video is fetched with the same guards as an image (scheme allow-list, address check, timeouts) under its
    own byte cap, its container is named by its first bytes (no format probing), its duration and frame size are
    checked from the header, then every frame is decoded once (a damaged file is found here, and a header that
    understates the duration). An mp4 is stored byte for byte; a mov or webm is re-encoded to H.264 mp4 (CRF
    `crf`, yuv420p, at its own size and frame rate), so every sample's video member is `<key>.mp4`. The sample's
    JSON and the unit's parquet record `duration` (seconds), `fps`, `num_frames`, `width`, `height` and
    `source_format`. Skips: `too_large`, `too_long`, `too_many_pixels` (`download_images.max_pixels`, per frame),
    `not_a_video` (no mp4/mov/webm signature, or no video stream), `unsupported_format` (a video container not in
    `formats`), `truncated` (cut short or damaged: the container cannot be read, a frame cannot be decoded, or
    fewer frames decode than the header lists)."""

    max_seconds: Annotated[float, Field(gt=0)] = 60.0
    """Longest video in seconds, from the header and again from the decoded frames' timestamps: `too_long`."""

    max_bytes: Annotated[Count, Field(ge=1)] = 256 * 1024 * 1024
    """Largest video file in bytes (for video rows it replaces `download_images.max_bytes`): `too_large`, the read
    stops at the cap."""

    formats: list[Literal["mp4", "mov", "webm"]] = list(VIDEO_FORMATS)
    """Containers accepted (by their signature: `ftyp` for mp4/mov, EBML with doctype webm). Others, Matroska
    included, are `unsupported_format`."""

    crf: Annotated[Count, Field(ge=0, le=51)] = 18
    """x264's constant rate factor when a mov or webm is re-encoded (0 lossless, 18 visually lossless, 23 x264's
    default)."""


class ReorganizeTarConfig(StrictModel):
    """Stage 3: shards of exactly `tar_chunk_size` samples, sorted by key; the tail marked `.INCOMPLETE`."""

    enable: bool = True
    """Run this stage."""

    tar_chunk_size: Annotated[Count, Field(ge=1)] = 1000
    """Samples per output shard (NeMo's default 1000)."""

    file_ext_in_tar: list[str] | None = None
    """Extensions every copied sample must have; a sample missing one is skipped and counted. Empty: the image
    extension (`mp4` for videos), `txt` and `json`."""


class GenerateWdinfoConfig(StrictModel):
    """Stage 4: `wdinfo.pkl` (NeMo's shard index) and `index.json` (the same, without pickle, with hashes)."""

    enable: bool = True
    """Run this stage."""


class IngestConfig(StrictModel):
    """Parquet (or jsonl/csv) of captions and image URLs or bytes -> WebDataset shards, NeMo's stages."""

    dataset_output_root: OptionalStr = None
    """Output folder or fsspec URL (`s3://bucket/datasets/name`). Empty: `$UNIRL_HOME/data/<recipe name>`."""

    download_parquet: DownloadParquetConfig = DownloadParquetConfig()
    """Stage 1: inputs and work units."""

    download_images: DownloadImagesConfig = DownloadImagesConfig()
    """Stage 2: fetch and transform images into raw shards."""

    reorganize_tar: ReorganizeTarConfig = ReorganizeTarConfig()
    """Stage 3: equal-size shards."""

    generate_wdinfo: GenerateWdinfoConfig = GenerateWdinfoConfig()
    """Stage 4: shard index."""

    video: VideoIngestConfig | None = None
    """Set (`video: {}` for the defaults) when the rows hold videos instead of images; see VideoIngestConfig."""

    def problems(self):
        yield from super().problems()
        if self.download_parquet.enable and not self.download_parquet.parquet_pattern:
            yield "download_parquet.parquet_pattern", [], "at least one input file, glob or URL"
        clash = sorted(set(self.download_images.save_additional_columns) & set(VIDEO_ROW_FIELDS))
        if self.video is not None and clash:
            yield "download_images.save_additional_columns", clash, "named like a video row field; rename them"

    @property
    def media_extension(self) -> str:
        """The member extension of every sample's image or video."""
        return "mp4" if self.video is not None else self.download_images.encode_format

    @property
    def file_ext_in_tar(self) -> list[str]:
        return self.reorganize_tar.file_ext_in_tar or [self.media_extension, "txt", "json"]


__all__ = ["IngestConfig", "Problem"]
