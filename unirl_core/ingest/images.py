"""Image bytes -> stored image bytes: decode (guarded), upright, RGB, resize, filter, encode.

Deterministic: the same bytes and options give the same output bytes. Differences from img2dataset: EXIF
orientation is applied; pixel count is checked from the header before decoding; alpha (and palette transparency)
is composited over white, 16-bit images are scaled (not clipped) to 8 bits, animations keep their first frame; a
JPEG being shrunk is decoded at reduced DCT scale (`draft`) first, which is most of the speed.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

from unirl_core.io.storage import is_permanent

PIL_FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
ORIENTATION_TAG = 0x0112
ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


class SkipSample(Exception):
    """This row yields no sample; `reason` is recorded (and counted) for it."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ImageOptions:
    resize_mode: str = "border"  # no | border | keep_ratio | keep_ratio_largest | center_crop
    image_size: int = 256
    resize_only_if_bigger: bool = False
    min_image_size: int = 0
    max_image_area: float | None = None
    max_aspect_ratio: float | None = None
    encode_format: str = "jpg"
    encode_quality: int = 95
    max_pixels: int = 89_478_485
    downscale_filter: str = "area"  # area | bicubic | lanczos


@dataclass(frozen=True)
class StoredImage:
    data: bytes
    width: int
    height: int
    original_width: int
    original_height: int
    sha256: str
    reencoded: bool

    def row_fields(self) -> dict:
        """The fields a row record and the sample's JSON carry for this image."""
        return {
            "width": self.width,
            "height": self.height,
            "original_width": self.original_width,
            "original_height": self.original_height,
            "sha256": self.sha256,
        }


# Raster formats a dataset image may come in. Anything else (EPS, which Pillow renders with Ghostscript, PDF, ...)
# is refused before a decoder runs.
INPUT_FORMATS = ("JPEG", "MPO", "PNG", "WEBP", "GIF", "BMP", "TIFF", "AVIF")
Image.init()  # register every plugin now: Image.OPEN fills lazily, and a thread racing that sees no formats
OPEN_FORMATS = [f for f in INPUT_FORMATS if f in Image.OPEN]


def process_image(data: bytes, options: ImageOptions) -> StoredImage:
    """The image to store for `data`, or SkipSample with the reason. Bytes are untrusted: whatever a decoder
    raises on them is a `decode_error` for this row, never a failure of the whole unit (a full or read-only
    disk is not the bytes' fault: it propagates)."""
    try:
        return _process(data, options)
    except SkipSample:
        raise
    except Exception as exc:  # malformed input reaches Pillow's decoders as many exception types
        if is_permanent(exc):
            raise
        raise SkipSample("decode_error", f"{type(exc).__name__}: {exc}") from None


def _process(data: bytes, options: ImageOptions) -> StoredImage:
    image = open_image(data, options.max_pixels)
    orientation = image.getexif().get(ORIENTATION_TAG, 1) if image.format in ("JPEG", "WEBP", "PNG", "TIFF") else 1
    width, height = image.size
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    _filter(width, height, options)
    target = _target_size(width, height, options)
    if _keep_original(image, orientation, (width, height), target, options):
        _verify_decodes(image)
        return StoredImage(data, width, height, width, height, hashlib.sha256(data).hexdigest(), reencoded=False)
    if image.format == "JPEG" and target[0] * 2 <= width:
        drafted = target if orientation not in (5, 6, 7, 8) else (target[1], target[0])
        image.draft("RGB", drafted)  # decode at 1/2, 1/4 or 1/8 scale, never below the target size
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as exc:
        raise SkipSample("decode_error", f"{type(exc).__name__}: {exc}") from None
    image = to_rgb(ImageOps.exif_transpose(image) if orientation != 1 else image)
    image = _resize(image, target, options)
    try:
        stored = _encode(image, options)
    except (OSError, ValueError) as exc:  # e.g. WebP's 16383-pixel limit
        raise SkipSample("encode_error", f"cannot encode as {options.encode_format}: {exc}") from None
    return StoredImage(stored, *image.size, width, height, hashlib.sha256(stored).hexdigest(), reencoded=True)


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Open untrusted image bytes: known formats only, pixel cap before decoding; SkipSample with the reason."""
    if not data:
        raise SkipSample("decode_error", "the image is empty (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=OPEN_FORMATS)
    except Image.DecompressionBombError as exc:
        raise SkipSample("too_many_pixels", str(exc)) from None
    except Image.UnidentifiedImageError:  # Pillow's message names the BytesIO by its memory address
        raise SkipSample(
            "decode_error", f"not a {'/'.join(OPEN_FORMATS)} image ({len(data)} bytes starting {data[:16]!r})"
        ) from None
    except (OSError, SyntaxError, ValueError) as exc:  # UnidentifiedImageError is an OSError
        raise SkipSample("decode_error", f"{type(exc).__name__}: {exc}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise SkipSample("too_many_pixels", f"{width}x{height} exceeds max_pixels {max_pixels}")
    if width < 1 or height < 1:
        raise SkipSample("decode_error", f"degenerate size {width}x{height}")
    return image


def _filter(width: int, height: int, options: ImageOptions) -> None:
    if min(width, height) < options.min_image_size:
        raise SkipSample("image_too_small", f"{width}x{height} below min_image_size {options.min_image_size}")
    if options.max_image_area is not None and width * height > options.max_image_area:
        raise SkipSample("image_too_large", f"{width}x{height} above max_image_area {options.max_image_area:g}")
    ratio = max(width, height) / min(width, height)
    if options.max_aspect_ratio is not None and ratio > options.max_aspect_ratio:
        raise SkipSample("bad_aspect_ratio", f"aspect ratio {ratio:.2f} above {options.max_aspect_ratio:g}")


def _target_size(width: int, height: int, options: ImageOptions) -> tuple[int, int]:
    """The size after resizing (before a crop or border): img2dataset's modes."""
    if options.resize_mode == "no":
        return width, height
    if options.resize_mode in ("keep_ratio", "center_crop"):
        scale = options.image_size / min(width, height)
    else:  # keep_ratio_largest, border
        scale = options.image_size / max(width, height)
    if options.resize_only_if_bigger and scale >= 1:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _keep_original(image, orientation, size, target, options) -> bool:
    """Original bytes are stored when decoding and re-encoding could only lose quality."""
    return (
        image.format == PIL_FORMATS[options.encode_format]
        and image.mode == "RGB"
        and orientation == 1
        and getattr(image, "n_frames", 1) == 1
        and size == target
        and _final_size(target, options) == size
    )


def _final_size(target: tuple[int, int], options: ImageOptions) -> tuple[int, int]:
    """The size `_resize` produces from an image resized to `target` (a crop or a border may follow)."""
    side = options.image_size
    if options.resize_mode == "center_crop" and min(target) >= side:
        return side, side
    if options.resize_mode == "border" and max(target) <= side:
        return side, side
    return target


def _verify_decodes(image: Image.Image) -> None:
    """A truncated file still has a good header: decode it, cheaply (1/8 scale for JPEG)."""
    if image.format == "JPEG":
        image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as exc:
        raise SkipSample("decode_error", f"{type(exc).__name__}: {exc}") from None


def to_rgb(image: Image.Image) -> Image.Image:
    """Deterministic 8-bit RGB: alpha and palette transparency over white, 16-bit scaled, CMYK converted."""
    if image.mode == "RGB":
        return image
    if image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        pixels = np.asarray(image, dtype=np.float64)
        scale = 257.0 if image.mode.startswith("I;16") or pixels.max(initial=0) > 255 else 1.0
        image = Image.fromarray(np.clip(np.rint(pixels / scale), 0, 255).astype(np.uint8), mode="L")
    if image.mode in ALPHA_MODES:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


DOWNSCALE_FILTERS = {
    "area": Image.Resampling.BOX,  # area averaging: OpenCV's INTER_AREA, img2dataset's choice for shrinking
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


def _resize(image: Image.Image, target: tuple[int, int], options: ImageOptions) -> Image.Image:
    if image.size != target:
        if target[0] < image.width:
            image = image.resize(target, DOWNSCALE_FILTERS[options.downscale_filter], reducing_gap=3.0)
        else:
            image = image.resize(target, Image.Resampling.LANCZOS)  # upscaling, as img2dataset
    side = options.image_size
    if options.resize_mode == "center_crop" and min(image.size) >= side:
        left, top = (image.width - side) // 2, (image.height - side) // 2
        image = image.crop((left, top, left + side, top + side))
    elif options.resize_mode == "border" and max(image.size) <= side and image.size != (side, side):  # pad
        canvas = Image.new("RGB", (side, side), (255, 255, 255))
        canvas.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
        image = canvas
    return image


def _encode(image: Image.Image, options: ImageOptions) -> bytes:
    out = io.BytesIO()
    pil_format = PIL_FORMATS[options.encode_format]
    if pil_format == "PNG":
        image.save(out, format="PNG", compress_level=6)
    else:
        image.save(out, format=pil_format, quality=options.encode_quality)
    return out.getvalue()
