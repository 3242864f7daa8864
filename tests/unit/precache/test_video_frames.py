"""Precache's video input (`precache.video_transform`): frames sampled by time, resized and center-cropped; short
clips skipped or padded; the cache identity of an image-only precache unchanged; the transform filled from
`train.sampling`."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from unirl_core.config.precache import PrecacheConfig, VideoTransformConfig
from unirl_core.data.video import Video, encode_mp4
from unirl_core.ingest.images import SkipSample
from unirl_core.precache.run import PrecacheError, cache_identity
from unirl_core.precache.video_frames import video_transform


def numbered_clip(frames: int, fps: float, size: tuple[int, int] = (48, 32)) -> bytes:
    """Frame i is a flat grey of 20 i: the sampled frame numbers can be read back from the pixels."""
    return encode_mp4(Video(tuple(Image.new("RGB", size, (20 * i,) * 3) for i in range(frames)), fps), crf=0)


def frame_numbers(pixels_3FHW: torch.Tensor) -> list[int]:
    return [round(((v.item() + 1) * 127.5) / 20) for v in pixels_3FHW[0, :, 8, 8]]


def transform(**fields) -> VideoTransformConfig:
    return VideoTransformConfig(**{"num_frames": 5, "fps": 4.0, "width": 16, "height": 16, **fields})


def test_frames_are_sampled_by_time_and_resized_then_center_cropped():
    pixels = video_transform(numbered_clip(12, 8.0), transform())  # frames at 0, 0.25, ... 1.0 s of an 8 fps clip
    assert pixels.shape == (3, 5, 16, 16) and pixels.dtype == torch.float32
    assert pixels.min() >= -1.0 and pixels.max() <= 1.0
    assert frame_numbers(pixels) == [0, 2, 4, 6, 8]  # every second frame: 4 fps out of 8
    slow = video_transform(numbered_clip(6, 4.0), transform(fps=8.0, num_frames=9))
    assert frame_numbers(slow) == [0, 0, 1, 1, 2, 2, 3, 3, 4]  # repeated: 8 fps out of 4


def test_a_clip_too_short_is_skipped_or_padded_with_its_last_frame():
    short = numbered_clip(4, 8.0)  # 0.5 s; 5 frames at 4 fps need 1 s
    with pytest.raises(SkipSample) as caught:
        video_transform(short, transform())
    assert caught.value.reason == "too_short" and "short_clips: pad" in str(caught.value)
    assert frame_numbers(video_transform(short, transform(short_clips="pad"))) == [0, 2, 3, 3, 3]
    exact = numbered_clip(9, 8.0)  # 9 frames at 8 fps last 1.125 s: the frame at 1.0 s is there
    assert frame_numbers(video_transform(exact, transform())) == [0, 2, 4, 6, 8]


def test_damaged_clips_are_skips():
    data = numbered_clip(12, 8.0)
    for bad, expected in ((data[: len(data) // 2], "truncated"), (b"not a video", "not_a_video")):
        with pytest.raises(SkipSample) as caught:
            video_transform(bad, transform())
        assert caught.value.reason == expected


def encodings(modality: str) -> dict:
    image = {"modality": modality, "extension": "mp4" if modality == "video" else "png", "key": "latent",
             "encoder_config": {"cls": "unirl_core.precache.encoders.PipelineImageEncoder"}}  # fmt: skip
    return {"input_dir": "in", "output_dir": "out", "encodings": [image]}


def test_only_a_video_cache_has_a_video_transform_in_its_identity():
    assert "video_transform" not in cache_identity(PrecacheConfig(**encodings("image")), None)
    video = PrecacheConfig(**encodings("video"), video_transform=transform())
    assert cache_identity(video, None)["video_transform"]["num_frames"] == 5


def test_a_video_encoding_without_frames_is_a_clear_error():
    from unirl_core.precache.run import Encoders

    with pytest.raises(PrecacheError, match=r"video_transform.num_frames is empty.*train.sampling.num_frames"):
        Encoders(PrecacheConfig(**encodings("video")))


def test_the_recipe_fills_the_video_transform_from_train_sampling():
    from unirl_core.config import load_recipe

    recipe = load_recipe("pipeline_video", ["ingest.download_parquet.parquet_pattern=x.parquet",
                                            "train.data.data_path=p.txt", "train.sampling.fps=null"])  # fmt: skip
    assert recipe.precache.video_transform.model_dump() == {
        "num_frames": 9,
        "fps": 16.0,
        "width": 32,
        "height": 32,
        "short_clips": "skip",
    }  # fmt: skip  (fps: null -> Wan's native 16)
