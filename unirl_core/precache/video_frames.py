"""A source video -> the encoder input of a video encoding: [3, F, H, W] in [-1, 1] (`precache.video_transform`).

The rule (documented on VideoTransformConfig and in docs/precache.md): output frame i is the clip's frame showing
at time i / fps from its first frame, i.e. the last frame whose timestamp is at most i / fps (a faster rate repeats
frames, a slower one drops them); the clip lasts from its first frame to the end of its last (last timestamp plus
one frame at the clip's rate). A clip that ends before (num_frames - 1) / fps is `too_short`: skipped, or padded
with its last frame (`short_clips: pad`). Frames are decoded one at a time and only the picked ones are kept, and
decoding stops after the last one, so memory and time do not grow with the clip's length. Each picked frame is
resized (bicubic) to cover width x height, then center-cropped to it.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from unirl_core.config.precache import VideoTransformConfig
from unirl_core.ingest.images import SkipSample
from unirl_core.ingest.videos import open_video

TOLERANCE_S = 1e-6  # timestamps are rationals rounded to a time base: a frame "at" i / fps may be a hair late


def video_transform(data: bytes, config: VideoTransformConfig) -> torch.Tensor:
    """Video file bytes -> float tensor [3, num_frames, height, width] in [-1, 1]. SkipSample(`too_short`,
    `truncated`, `not_a_video`, ...) for a clip that cannot give its frames."""
    assert config.complete, "video_transform fields are filled from train.sampling (recipe.py) or set explicitly"
    frames = _pick_frames(data, config)
    pixels = np.stack([np.asarray(_cover_crop(f, config.width, config.height)) for f in frames])  # [F, H, W, 3]
    return torch.from_numpy(pixels).permute(3, 0, 1, 2).float().div(127.5).sub(1.0)


def _pick_frames(data: bytes, config: VideoTransformConfig) -> list[Image.Image]:
    """The `num_frames` frames of the rule above, as RGB images."""
    import av

    times = [i / config.fps for i in range(config.num_frames)]
    picked, current, first, end = [], None, None, 0.0
    try:
        with open_video(data) as container:
            stream = container.streams.video[0]
            step = 1.0 / float(stream.average_rate or stream.guessed_rate or 16)
            for number, frame in enumerate(container.decode(stream)):
                time = frame.time if frame.time is not None else number * step
                first = time if first is None else first
                while (
                    current is not None and len(picked) < len(times) and times[len(picked)] < time - first - TOLERANCE_S
                ):
                    picked.append(current)  # fmt: skip
                if len(picked) == len(times):
                    break
                current, end = frame, time - first + step  # converted to an image only if picked
    except av.FFmpegError as exc:
        raise SkipSample("truncated", f"a frame cannot be decoded ({exc})") from None
    if current is None:
        raise SkipSample("truncated", "no frame decodes")
    while len(picked) < len(times) and times[len(picked)] < end - TOLERANCE_S:
        picked.append(current)
    if len(picked) < len(times):
        if config.short_clips == "skip":
            raise SkipSample("too_short", f"a clip of {end:.2f} s; {config.num_frames} frames at {config.fps:g} fps "
                             f"need more than {times[-1]:.2f} s (or precache.video_transform.short_clips: pad)")  # fmt: skip
        picked += [current] * (len(times) - len(picked))
    images = {id(frame): frame.to_image() for frame in picked}  # a repeated frame is converted once
    return [images[id(frame)] for frame in picked]


def _cover_crop(image: Image.Image, width: int, height: int) -> Image.Image:
    """Resize to cover width x height (aspect kept), then crop the center."""
    image = image.convert("RGB")
    scale = max(width / image.width, height / image.height)
    size = (max(width, round(image.width * scale)), max(height, round(image.height * scale)))
    if size != image.size:
        image = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
    left, top = (image.width - width) // 2, (image.height - height) // 2
    return image.crop((left, top, left + width, top + height))
