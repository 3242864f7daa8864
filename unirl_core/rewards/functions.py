"""Weight-free rewards by name: small factories, as DDPO's, each scoring a list of PIL images (and prompts).

| name                     | score                                                            |
|--------------------------|------------------------------------------------------------------|
| jpeg_compressibility     | -(JPEG quality-95 size in kB) (DDPO): smoother images score higher |
| jpeg_incompressibility   | +(JPEG quality-95 size in kB)                                     |
| brightness               | mean luma in [0, 1]                                              |
| dark_fraction            | fraction of pixels with luma < 0.1                               |
| edge_density             | fraction of pixels whose luma gradient exceeds 0.1              |
| colour_entropy           | entropy (bits) of the 4-bit-per-channel colour histogram         |
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

RewardFn = Callable[[Sequence[Image.Image], Sequence[str]], np.ndarray]


def _jpeg_kb(image: Image.Image) -> float:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=95)
    return buffer.tell() / 1000.0


def _luma(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("L"), dtype=np.float64) / 255.0


def jpeg_compressibility(images, prompts=()) -> np.ndarray:
    return np.array([-_jpeg_kb(im) for im in images])


def jpeg_incompressibility(images, prompts=()) -> np.ndarray:
    return np.array([_jpeg_kb(im) for im in images])


def brightness(images, prompts=()) -> np.ndarray:
    return np.array([_luma(im).mean() for im in images])


def dark_fraction(images, prompts=()) -> np.ndarray:
    return np.array([(_luma(im) < 0.1).mean() for im in images])


def edge_density(images, prompts=()) -> np.ndarray:
    def density(image):
        luma = _luma(image)
        gradient = np.hypot(np.diff(luma, axis=0)[:, :-1], np.diff(luma, axis=1)[:-1, :])
        return (gradient > 0.1).mean() if gradient.size else 0.0

    return np.array([density(im) for im in images])


def colour_entropy(images, prompts=()) -> np.ndarray:
    def entropy(image):
        quantized = np.asarray(image.convert("RGB"), dtype=np.uint16) >> 4
        codes = (quantized[..., 0] << 8) | (quantized[..., 1] << 4) | quantized[..., 2]
        counts = np.bincount(codes.ravel(), minlength=4096).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log2(p)).sum())

    return np.array([entropy(im) for im in images])


REWARDS: dict[str, RewardFn] = {
    "jpeg_compressibility": jpeg_compressibility,
    "jpeg_incompressibility": jpeg_incompressibility,
    "brightness": brightness,
    "dark_fraction": dark_fraction,
    "edge_density": edge_density,
    "colour_entropy": colour_entropy,
}
