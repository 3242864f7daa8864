"""A generated (or loaded) video: its frames as PIL images and its frame rate. Video families' `decode` returns these
as the rollout's outputs; rewards score them (image rewards frame by frame, see `rewards/video.py`), grids show them
as frame strips and MLflow keeps them as mp4.

    spaced_frames(video, 4)   -> 4 frames evenly spaced, the first and the last included
    encode_mp4(video)         -> mp4 bytes (H.264, yuv420p; an odd width or height padded by its last pixel row)
    read_video("clip.mp4")    -> a Video of every decoded frame (a path or the file's bytes; any format PyAV reads)

PyAV (libav's bindings) is imported inside the functions: nothing else here needs it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".avi")  # files `unirl rewards score` reads as videos
MP4_CRF = 18  # x264's constant rate factor: 18 is visually lossless (0 lossless, 23 x264's default)


@dataclass(frozen=True)
class Video:
    frames: tuple[Image.Image, ...]  # RGB, all one size
    fps: float = 16.0

    def __post_init__(self):
        if not self.frames:
            raise ValueError("a video needs at least one frame")

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the frames, as PIL's `Image.size`."""
        return self.frames[0].size

    def __len__(self) -> int:
        return len(self.frames)


def is_video(output) -> bool:
    return isinstance(output, Video)


def spaced_indices(length: int, count: int) -> list[int]:
    """`count` frame indices of a `length`-frame video, evenly spaced with the first and the last included (every
    frame when it has no more than `count`; the first alone when `count` is 1)."""
    if count == 1 or length == 1:
        return [0]
    if length <= count:
        return list(range(length))
    return [round(i * (length - 1) / (count - 1)) for i in range(count)]


def spaced_frames(video: Video, count: int) -> list[Image.Image]:
    return [video.frames[i] for i in spaced_indices(len(video), count)]


def _even_rgb(image: Image.Image) -> np.ndarray:
    """[H, W, 3] uint8 with H and W rounded up to even (yuv420p halves both), the last row/column repeated."""
    pixels = np.asarray(image.convert("RGB"))
    height, width = pixels.shape[:2]
    return np.pad(pixels, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")


def encode_mp4(video: Video, crf: int = MP4_CRF) -> bytes:
    """`video` as an H.264 mp4 (yuv420p, what browsers and MLflow's artifact view play) at its frame rate."""
    import av

    buffer = io.BytesIO()
    first = _even_rgb(video.frames[0])
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(video.fps).limit_denominator(1001))
        stream.height, stream.width = first.shape[:2]
        stream.pix_fmt, stream.options = "yuv420p", {"crf": str(crf)}
        for frame in video.frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(_even_rgb(frame), format="rgb24")):
                container.mux(packet)
        container.mux(stream.encode())  # flush the encoder's delayed frames
    return buffer.getvalue()


def read_video(source: str | Path | bytes) -> Video:
    """Every frame of the first video stream of `source` (a file path or its bytes) as RGB, with its frame rate
    (16 when the file names none). ValueError, naming the file, when it holds no readable video."""
    import av

    name = "<bytes>" if isinstance(source, bytes) else str(source)
    try:
        with av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source)) as container:
            if not container.streams.video:
                raise ValueError(f"{name}: no video stream")
            stream = container.streams.video[0]
            frames = tuple(frame.to_image() for frame in container.decode(stream))
            rate = stream.average_rate or stream.guessed_rate
    except av.FFmpegError as exc:
        raise ValueError(f"{name}: not a video PyAV can read ({exc})") from None
    if not frames:
        raise ValueError(f"{name}: the video stream has no frames")
    return Video(frames, float(rate) if rate else 16.0)
