"""Image transform: every decode/convert case of RELIABILITY.md's ingest table, and img2dataset's resize modes."""

from __future__ import annotations

import io

import image_cases as cases
import numpy as np
import pytest
from PIL import Image

from unirl_core.ingest.images import ImageOptions, SkipSample, process_image


def decoded(stored) -> Image.Image:
    return Image.open(io.BytesIO(stored.data))


def pixel(image: Image.Image, x: float, y: float) -> np.ndarray:
    return np.asarray(image.convert("RGB"))[int(y * image.height), int(x * image.width)].astype(int)


def close_to(color, expected, tolerance=40) -> bool:
    return bool(np.all(np.abs(np.asarray(color) - np.asarray(expected)) < tolerance))


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_orientation_is_applied(orientation):
    stored = process_image(cases.exif_rotated(orientation), ImageOptions(resize_mode="no"))
    image = decoded(stored)
    assert image.size == (300, 200) and (stored.width, stored.height) == (300, 200)
    assert close_to(pixel(image, 0.25, 0.25), cases.RED)  # red stays top-left when upright
    assert close_to(pixel(image, 0.75, 0.75), cases.BLUE)


@pytest.mark.parametrize(
    ("data", "where", "expected"),
    [
        (cases.cmyk_jpeg(), (0.5, 0.5), (255, 0, 0)),
        (cases.palette_with_transparency(), (0.25, 0.5), (200, 0, 0)),
        (cases.palette_with_transparency(), (0.75, 0.5), (255, 255, 255)),  # transparent -> white
        (cases.rgba_png(), (0.75, 0.5), (255, 255, 255)),
        (cases.rgba_png(), (0.25, 0.5), (0, 0, 255)),
        (cases.la_png(), (0.5, 0.5), (255, 255, 255)),
        (cases.animated_gif(), (0.5, 0.5), cases.RED),  # first frame
        (cases.animated_webp(), (0.5, 0.5), cases.RED),
        (cases.grayscale_jpeg(), (0.5, 0.5), (128, 128, 128)),
    ],
)
def test_modes_become_deterministic_rgb(data, where, expected):
    options = ImageOptions(resize_mode="no", encode_format="png")
    stored = process_image(data, options)
    image = decoded(stored)
    assert image.mode == "RGB"
    assert close_to(pixel(image, *where), expected)
    assert process_image(data, options).data == stored.data  # deterministic


def test_sixteen_bit_is_scaled_not_clipped():
    image = decoded(process_image(cases.sixteen_bit_png(), ImageOptions(resize_mode="no", encode_format="png")))
    values = np.asarray(image)[..., 0]
    assert values.min() == 0 and values.max() == 255 and len(np.unique(values)) > 200


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (cases.decompression_bomb(), "too_many_pixels"),
        (cases.decompression_bomb(10_000, 10_000), "too_many_pixels"),  # under Pillow's own bomb limit, over ours
        (cases.truncated_jpeg(), "decode_error"),
        (cases.HTML, "decode_error"),
        (b"", "decode_error"),
    ],
)
def test_bad_bytes_are_skipped_with_a_reason(data, reason):
    with pytest.raises(SkipSample) as info:
        process_image(data, ImageOptions())
    assert info.value.reason == reason


def test_truncated_jpeg_is_caught_even_when_the_original_would_be_kept():
    with pytest.raises(SkipSample, match="truncated"):
        process_image(cases.truncated_jpeg(), ImageOptions(resize_mode="no"))


@pytest.mark.parametrize(
    ("mode", "size", "expected"),
    [
        ("keep_ratio", (400, 200), (512, 256)),
        ("keep_ratio_largest", (400, 200), (256, 128)),
        ("center_crop", (400, 200), (256, 256)),
        ("border", (400, 200), (256, 256)),
        ("no", (400, 200), (400, 200)),
        ("keep_ratio", (100, 50), (512, 256)),  # upscales unless resize_only_if_bigger
    ],
)
def test_resize_modes(mode, size, expected):
    stored = process_image(cases.jpeg(*size), ImageOptions(resize_mode=mode, image_size=256))
    assert decoded(stored).size == expected == (stored.width, stored.height)
    assert (stored.original_width, stored.original_height) == size


def test_border_pads_with_white_and_resize_only_if_bigger():
    image = decoded(process_image(cases.jpeg(400, 200), ImageOptions(resize_mode="border", encode_format="png")))
    assert close_to(pixel(image, 0.5, 0.02), (255, 255, 255), tolerance=2)
    small = process_image(cases.jpeg(100, 50), ImageOptions(resize_mode="keep_ratio", resize_only_if_bigger=True))
    assert (small.width, small.height) == (100, 50)


def test_original_bytes_kept_when_nothing_changes():
    data = cases.jpeg(256, 200)
    kept = process_image(data, ImageOptions(resize_mode="keep_ratio_largest", image_size=256))
    assert kept.data == data and not kept.reencoded
    png = process_image(data, ImageOptions(resize_mode="no", encode_format="png"))
    assert png.reencoded and decoded(png).format == "PNG"


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (ImageOptions(min_image_size=300), "image_too_small"),
        (ImageOptions(max_image_area=10_000), "image_too_large"),
        (ImageOptions(max_aspect_ratio=1.5), "bad_aspect_ratio"),
    ],
)
def test_filters(options, reason):
    with pytest.raises(SkipSample) as info:
        process_image(cases.jpeg(400, 200), options)
    assert info.value.reason == reason


@pytest.mark.parametrize("downscale_filter", ["area", "bicubic", "lanczos"])
def test_downscale_filters_give_the_same_size_and_differ_in_pixels(downscale_filter):
    options = ImageOptions(resize_mode="keep_ratio", image_size=64, downscale_filter=downscale_filter)
    stored = process_image(cases.jpeg(400, 300, seed=8), options)
    assert decoded(stored).size == (85, 64)
    area = process_image(cases.jpeg(400, 300, seed=8), ImageOptions(resize_mode="keep_ratio", image_size=64))
    assert (stored.data == area.data) == (downscale_filter == "area")


def test_any_decoder_failure_is_a_row_skip():
    png = cases.encode(cases.procedural(200, 150), "PNG")
    with pytest.raises(SkipSample) as info:
        process_image(png[: len(png) // 2], ImageOptions(resize_mode="no", encode_format="png"))
    assert info.value.reason == "decode_error"
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(SkipSample) as info:
        process_image(eps, ImageOptions())
    assert info.value.reason == "decode_error"


def test_encoder_limits_are_a_row_skip():
    wide = cases.encode(Image.new("RGB", (17_000, 8), (10, 20, 30)), "PNG")
    with pytest.raises(SkipSample) as info:
        process_image(wide, ImageOptions(resize_mode="no", encode_format="webp"))
    assert info.value.reason == "encode_error"


def test_the_first_image_of_a_fresh_process_decodes(tmp_path):
    """Regression: Pillow registers its formats lazily; the allow-list must not be computed before that."""
    import subprocess
    import sys

    (tmp_path / "a.jpg").write_bytes(cases.jpeg(64, 48))
    code = (
        f"data = open({str(tmp_path / 'a.jpg')!r}, 'rb').read();"
        "from unirl_core.ingest.images import process_image, ImageOptions;"
        "print(process_image(data, ImageOptions(resize_mode='no')).width)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "64"
