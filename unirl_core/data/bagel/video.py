"""BAGEL's video frame sampler (`frame_sampler_args`): n = randint(min_num_frames, max_num_frames) frames from a
video of L frames. A `<video>` placeholder in a `vlm_sft` sample becomes one `<image>` per returned frame.

`target: bagel` draws as BAGEL's `get_frame_indices(sample="rand")` does (data/video_utils.py): k = min(n, L)
segments with bounds int(linspace(0, L, k + 1)); in segment [a, b) one frame drawn from a .. b - 2 (BAGEL's range
stops one short of the segment's last frame); if any segment is too short for that, k distinct frames drawn from the
whole video, in order; a video shorter than n repeats its last drawn frame up to n frames. The draws come from the
sample's own seeded generator (BAGEL uses the global one), so a sample is the same on every visit.
`target: unirl` takes the middle frame of each of min(n, L) equal segments (no repeats).

Decoding uses PyAV, an optional extra (`pip install 'unirl[video]'`), imported only when a video is read.
"""

from __future__ import annotations

import io
import itertools
import random

import numpy as np
from PIL import Image

from unirl_core.io import storage


class VideoDecodeError(ValueError):
    """A video that cannot be read (missing, corrupt, no video stream); the dataset skips the sample and counts it."""


def _import_av():
    try:
        import av
    except ImportError as e:
        raise ImportError("reading videos needs PyAV: pip install 'unirl[video]'") from e
    return av


def frame_indexes(num_video_frames: int, num_frames: int) -> list[int]:
    """The middle frame of each of `num_frames` equal segments of a video of `num_video_frames` frames."""
    assert 1 <= num_frames <= num_video_frames, (num_frames, num_video_frames)
    return [int((i + 0.5) * num_video_frames / num_frames) for i in range(num_frames)]


def bagel_frame_indexes(num_video_frames: int, num_frames: int, rng: random.Random) -> list[int]:
    """BAGEL's random frame choice (module docstring): `num_frames` indexes, non-decreasing, the last one repeated
    when the video is shorter."""
    count = min(num_frames, num_video_frames)
    bounds = np.linspace(0, num_video_frames, count + 1).astype(int).tolist()
    try:
        indexes = [rng.choice(range(start, end - 1)) for start, end in itertools.pairwise(bounds)]
    except IndexError:  # a segment of 1 or 2 frames: range(start, end - 1) is empty
        indexes = sorted(rng.sample(range(num_video_frames), count))
    return indexes + indexes[-1:] * (num_frames - len(indexes))


class FrameSampler:
    """Picks `min_num_frames` to `max_num_frames` RGB frames spread evenly across a video."""

    def __init__(self, max_num_frames: int = 12, min_num_frames: int = 8, target: str = "bagel"):
        if not 1 <= min_num_frames <= max_num_frames:
            raise ValueError(
                f"frame_sampler_args: need 1 <= min_num_frames <= max_num_frames, "
                f"got min_num_frames={min_num_frames}, max_num_frames={max_num_frames}"
            )
        self.max_num_frames = max_num_frames
        self.min_num_frames = min_num_frames
        self.target = target

    def __call__(self, path: str, rng: random.Random) -> tuple[list[Image.Image], list[int]]:
        """(frames, their indexes in the video), indexes non-decreasing. Raises VideoDecodeError naming `path`."""
        av = _import_av()
        num_frames = rng.randint(self.min_num_frames, self.max_num_frames)
        source = _source(path)
        try:
            num_video_frames = _count_frames(av, source, path)
            if num_video_frames == 0:
                raise VideoDecodeError(f"video {path} has no frames")
            if self.target == "bagel":
                indexes = bagel_frame_indexes(num_video_frames, num_frames, rng)
            else:
                indexes = frame_indexes(num_video_frames, min(num_frames, num_video_frames))
            frames = _decode_frames(av, source, path, indexes)
        except av.FFmpegError as e:  # FileNotFoundError, InvalidDataError, ... all derive from it
            raise VideoDecodeError(f"cannot decode video {path}: {e}") from e
        if len(frames) < len(indexes):
            raise VideoDecodeError(f"video {path}: its header says {num_video_frames} frames, fewer could be decoded")
        return frames, indexes


def _video_stream(container, path: str):
    if not container.streams.video:
        raise VideoDecodeError(f"{path} has no video stream")
    return container.streams.video[0]


def _source(path: str) -> str | io.BytesIO:
    """What PyAV opens: a local path as is; a URL (s3://, gs://, https://) read once through fsspec, since FFmpeg's
    own protocols do not speak S3 or carry fsspec's credentials. A rewound buffer for each open."""
    if not storage.is_url(path):
        return path
    try:
        return io.BytesIO(storage.read_bytes(path))
    except FileNotFoundError as e:
        raise VideoDecodeError(f"video {path} does not exist") from e


def _open(av, source: str | io.BytesIO):
    if isinstance(source, io.BytesIO):
        source.seek(0)
    return av.open(source)


def _count_frames(av, source: str | io.BytesIO, path: str) -> int:
    with _open(av, source) as container:
        stream = _video_stream(container, path)
        # Some containers (e.g. webm, some mkv) leave the frame count at 0: decode to count (fine for short clips).
        return stream.frames or sum(1 for _ in container.decode(stream))


def _decode_frames(av, source: str | io.BytesIO, path: str, indexes: list[int]) -> list[Image.Image]:
    """The frames at `indexes` (a repeated index gives the same frame again); fewer when the stream ends early."""
    wanted, decoded = set(indexes), {}
    with _open(av, source) as container:
        for i, frame in enumerate(container.decode(_video_stream(container, path))):
            if i in wanted:
                decoded[i] = frame.to_image()  # rgb24
            if i >= indexes[-1]:
                break
    return [decoded[i] for i in indexes if i in decoded]
