"""Video bytes -> stored video bytes: container named by its signature, header caps, a full decode check, and
H.264 mp4 for whatever is not an mp4 already. The video counterpart of images.py (the `ingest.video` section).

    process_video(data, VideoOptions(max_seconds=30)) -> StoredVideo (mp4 bytes, size, frames, fps, duration)
    open_video(data, formats)                         -> an open PyAV container (for readers of stored videos)

Bytes are untrusted. libav guesses a container from the bytes unless told, and some of its demuxers (HLS, concat)
open further files or URLs: the container is chosen from the file's first bytes (`ftyp` box: mp4/mov; EBML header
with doctype webm: webm) and forced, nothing is probed. The duration and the frame size are checked from the header
before decoding; every frame is then decoded once, frame by frame (memory stays at one frame), which finds a file
cut short and a header that understates the duration. Deterministic: the same bytes and options give the same
output bytes (x264 is deterministic unless told otherwise). PyAV is imported inside the functions.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from unirl_core.errors import UserError
from unirl_core.ingest.images import SkipSample
from unirl_core.io.storage import is_permanent

DEMUXERS = {"mp4": "mov", "mov": "mov", "webm": "matroska"}  # our format name -> the libav demuxer forced for it
EBML_MAGIC = b"\x1a\x45\xdf\xa3"


@dataclass(frozen=True)
class VideoOptions:
    max_seconds: float = 60.0
    max_pixels: int = 89_478_485  # per frame
    formats: tuple[str, ...] = ("mp4", "mov", "webm")
    crf: int = 18


@dataclass(frozen=True)
class StoredVideo:
    data: bytes  # mp4
    width: int  # of the stored mp4: a re-encoded odd size is padded to even (yuv420p)
    height: int
    original_width: int
    original_height: int
    num_frames: int
    fps: float
    duration: float  # seconds, first frame to the end of the last
    source_format: str  # mp4 | mov | webm
    sha256: str
    reencoded: bool

    def row_fields(self) -> dict:
        """The fields a row record and the sample's JSON carry for this video."""
        return {
            "width": self.width,
            "height": self.height,
            "original_width": self.original_width,
            "original_height": self.original_height,
            "sha256": self.sha256,
            "duration": self.duration,
            "fps": self.fps,
            "num_frames": self.num_frames,
            "source_format": self.source_format,
        }


def require_av() -> None:
    """A clear error, before any row, when PyAV is not installed (else every video would be a skipped row)."""
    try:
        import av  # noqa: F401
    except ImportError:
        raise UserError(
            "videos need PyAV, which is not installed: pip install 'unirl[video]' (or pip install av)"
        ) from None


def sniff_format(data: bytes) -> str | None:
    """mp4, mov, webm or mkv from the first bytes; None when they name no video container we know."""
    if len(data) >= 12 and data[4:8] == b"ftyp":
        return "mov" if data[8:12] == b"qt  " else "mp4"
    if data[:4] == EBML_MAGIC:
        return "webm" if b"webm" in data[:64] else "mkv"
    return None


def open_video(data: bytes, formats: tuple[str, ...] = tuple(DEMUXERS)):
    """Open untrusted video bytes with the demuxer their signature names; SkipSample with the reason otherwise."""
    import av

    if not data:
        raise SkipSample("not_a_video", "the video is empty (0 bytes)")
    found = sniff_format(data)
    if found is None:
        raise SkipSample("not_a_video", f"not an mp4, mov or webm file ({len(data)} bytes starting {data[:16]!r})")
    if found not in formats:
        raise SkipSample("unsupported_format", f"a {found} file; accepted formats (ingest.video.formats): {formats}")
    try:
        container = av.open(io.BytesIO(data), format=DEMUXERS[found])
    except av.FFmpegError as exc:
        raise SkipSample("truncated", f"a {found} file libav cannot read, cut short or damaged ({exc})") from None
    if not container.streams.video:
        container.close()
        raise SkipSample("not_a_video", f"a {found} file without a video stream")
    return container


def process_video(data: bytes, options: VideoOptions) -> StoredVideo:
    """The video to store for `data`, or SkipSample with the reason. Whatever libav raises on the bytes is a skip of
    this row (`truncated`), never a failure of the unit (a full or read-only disk propagates)."""
    try:
        return _process(data, options)
    except SkipSample:
        raise
    except Exception as exc:
        if is_permanent(exc):
            raise
        raise SkipSample("truncated", f"{type(exc).__name__}: {exc}") from None


def _process(data: bytes, options: VideoOptions) -> StoredVideo:
    source_format = sniff_format(data)
    with open_video(data, options.formats) as container:
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > options.max_pixels:
            raise SkipSample("too_many_pixels", f"{width}x{height} frames exceed max_pixels {options.max_pixels}")
        _check_header_duration(container, stream, options.max_seconds)
        rate = stream.average_rate or stream.guessed_rate or Fraction(16)
        encoder = None if source_format == "mp4" else _Mp4Encoder(width, height, rate, options.crf)
        declared = stream.frames  # from the header; 0 when it names no count (webm)
        count, first, last = _decode_all(container, stream, options.max_seconds, encoder)
    if count == 0 or (declared and count < declared):
        raise SkipSample("truncated", f"{count} of {declared or 'some'} frames decode: cut short or damaged")
    stored = data if encoder is None else encoder.finish()
    size = (width, height) if encoder is None else (encoder.stream.width, encoder.stream.height)
    duration = round(last - first + 1 / float(rate), 6)
    return StoredVideo(stored, *size, width, height, count, round(float(rate), 6), duration, source_format,
                       hashlib.sha256(stored).hexdigest(), reencoded=encoder is not None)  # fmt: skip


def _check_header_duration(container, stream, max_seconds: float) -> None:
    seconds = None
    if stream.duration is not None and stream.time_base:
        seconds = float(stream.duration * stream.time_base)
    elif container.duration is not None:
        seconds = container.duration / 1_000_000  # AV_TIME_BASE
    if seconds is not None and seconds > max_seconds:
        raise SkipSample("too_long", f"{seconds:.2f} s (from the header) exceeds max_seconds {max_seconds:g}")


def _decode_all(container, stream, max_seconds: float, encoder) -> tuple[int, float, float]:
    """(frames decoded, first and last frame time in seconds); each frame goes to `encoder` when there is one."""
    import av

    count, first, last = 0, None, 0.0
    try:
        for frame in container.decode(stream):
            time = frame.time if frame.time is not None else count / float(stream.average_rate or 16)
            first = time if first is None else first
            last = max(last, time)
            if last - first > max_seconds:
                raise SkipSample("too_long", f"frames past {max_seconds:g} s (the header said less)")
            count += 1
            if encoder is not None:
                encoder.add(frame)
    except av.FFmpegError as exc:
        raise SkipSample("truncated", f"frame {count} cannot be decoded: cut short or damaged ({exc})") from None
    return count, first or 0.0, last


class _Mp4Encoder:
    """H.264 mp4 (yuv420p, CRF) written frame by frame at a constant rate; odd sizes padded by the last row/column."""

    def __init__(self, width: int, height: int, rate: Fraction, crf: int):
        import av

        self.buffer = io.BytesIO()
        self.container = av.open(self.buffer, mode="w", format="mp4")
        self.stream = self.container.add_stream("libx264", rate=Fraction(rate).limit_denominator(1001))
        self.stream.width, self.stream.height = width + width % 2, height + height % 2
        self.stream.pix_fmt, self.stream.options = "yuv420p", {"crf": str(crf)}
        # one encoder thread: threaded x264 (frame threads, lookahead) may give other bytes on a loaded machine
        self.stream.codec_context.thread_count, self.stream.codec_context.thread_type = 1, "NONE"

    def add(self, frame) -> None:
        import av

        pixels = frame.to_ndarray(format="rgb24")
        height, width = pixels.shape[:2]
        pixels = np.pad(pixels, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")
        for packet in self.stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
            self.container.mux(packet)

    def finish(self) -> bytes:
        self.container.mux(self.stream.encode())  # flush the encoder's delayed frames
        self.container.close()
        return self.buffer.getvalue()
