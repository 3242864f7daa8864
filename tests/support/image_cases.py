"""Image bytes for tests: good procedural images and every bad case of RELIABILITY.md's ingest table."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

RED, BLUE, GREEN = (220, 20, 20), (20, 20, 220), (20, 200, 20)


def encode(image: Image.Image, fmt: str = "JPEG", **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **kwargs)
    return out.getvalue()


def procedural(width: int, height: int, seed: int = 0) -> Image.Image:
    """A gradient with a few rectangles: compresses like a photo more than a flat colour does."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], -1)
    pixels = pixels.astype(np.uint8)
    for _ in range(3):
        x0, y0 = rng.integers(0, width // 2), rng.integers(0, height // 2)
        pixels[y0 : y0 + height // 4, x0 : x0 + width // 4] = rng.integers(0, 256, 3)
    noise = rng.integers(0, 12, pixels.shape, dtype=np.uint8)
    return Image.fromarray(pixels + noise, "RGB")


def jpeg(width: int = 320, height: int = 240, seed: int = 0, quality: int = 90) -> bytes:
    return encode(procedural(width, height, seed), "JPEG", quality=quality)


def upright_marker(width: int = 300, height: int = 200) -> Image.Image:
    """Landscape, red top-left quadrant, blue elsewhere: shows which way is up."""
    image = Image.new("RGB", (width, height), BLUE)
    image.paste(Image.new("RGB", (width // 2, height // 2), RED), (0, 0))
    return image


def exif_rotated(orientation: int) -> bytes:
    """A JPEG whose stored pixels need EXIF `orientation` (3, 6 or 8) to show `upright_marker()`."""
    stored = {
        3: Image.Transpose.ROTATE_180,
        6: Image.Transpose.ROTATE_90,
        8: Image.Transpose.ROTATE_270,
    }[orientation]
    image = upright_marker().transpose(stored)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(image, "JPEG", quality=95, exif=exif.tobytes())


def cmyk_jpeg() -> bytes:
    return encode(Image.new("CMYK", (64, 48), (0, 255, 255, 0)), "JPEG", quality=95)  # red in CMYK


def palette_with_transparency() -> bytes:
    image = Image.new("P", (64, 64), 0)
    image.putpalette([0, 0, 0, 200, 0, 0] + [0] * 762)
    image.paste(1, (0, 0, 32, 64))  # left half colour 1 (red), right half colour 0 (transparent)
    return encode(image, "PNG", transparency=0)


def rgba_png() -> bytes:
    image = Image.new("RGBA", (64, 64), (0, 0, 255, 0))
    image.paste((0, 0, 255, 255), (0, 0, 32, 64))
    return encode(image, "PNG")


def la_png() -> bytes:
    return encode(Image.new("LA", (40, 40), (0, 0)), "PNG")


def sixteen_bit_png() -> bytes:
    pixels = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    return encode(Image.fromarray(pixels), "PNG")  # uint16 -> mode I;16


def grayscale_jpeg() -> bytes:
    return encode(Image.new("L", (50, 40), 128), "JPEG")


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (40, 40), RED), Image.new("RGB", (40, 40), GREEN)]
    return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def animated_webp() -> bytes:
    frames = [Image.new("RGB", (40, 40), RED), Image.new("RGB", (40, 40), GREEN)]
    return encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=100, lossless=True)


def decompression_bomb(width: int = 100_000, height: int = 100_000) -> bytes:
    """A few hundred bytes whose header claims 10 gigapixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


def truncated_jpeg() -> bytes:
    data = jpeg(400, 300, seed=3)
    return data[: len(data) // 2]


HTML = b"<!doctype html><html><body>Not an image</body></html>"
