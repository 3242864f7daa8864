"""BAGEL's deterministic image transform: the resize rule of FORMATS.md section 5, transparency on white, bicubic
resize with antialias, values in [-1, 1].

    scale = max(min(max_size / max(w, h), 1), min_size / min(w, h))
    side  -> max(stride, round(side * scale / stride) * stride)
    if w * h > max_pixels / image_count: shrink both sides by the area ratio, re-round
    if the long side > max_size:         shrink again, re-round

VAE images use stride 16 (VAE downsample 8 x latent patch 2), ViT images stride 14.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image


@dataclass(frozen=True)
class ImageTransformArgs:
    """BAGEL's `image_transform_args` / `vit_image_transform_args` keys."""

    image_stride: int = 16
    max_image_size: int = 1024
    min_image_size: int = 512
    max_pixels: int = 14 * 14 * 9 * 1024

    def __post_init__(self):
        if self.image_stride < 1 or self.min_image_size < 1 or self.max_image_size < self.min_image_size:
            raise ValueError(
                f"image_transform_args: need image_stride >= 1 and 1 <= min_image_size <= max_image_size, got "
                f"stride {self.image_stride}, min {self.min_image_size}, max {self.max_image_size}"
            )


def _round_to(side: float, stride: int) -> int:
    return max(stride, round(side / stride) * stride)


def target_size(width: int, height: int, args: ImageTransformArgs, image_count: int = 1) -> tuple[int, int]:
    """(width, height) after the rule above; both multiples of the stride."""
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height}: both sides must be at least 1 pixel")
    stride = args.image_stride
    scale = max(min(args.max_image_size / max(width, height), 1.0), args.min_image_size / min(width, height))
    w, h = _round_to(width * scale, stride), _round_to(height * scale, stride)
    budget = args.max_pixels / max(1, image_count)
    if w * h > budget:
        ratio = math.sqrt(budget / (w * h))
        w, h = _round_to(w * ratio, stride), _round_to(h * ratio, stride)
    if max(w, h) > args.max_image_size:
        ratio = args.max_image_size / max(w, h)
        w, h = _round_to(w * ratio, stride), _round_to(h * ratio, stride)
    return w, h


def flatten_on_white(image: Image.Image) -> Image.Image:
    """RGB; RGBA, LA and palette images with transparency are pasted on white first."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA"):
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image.convert("RGBA"), mask=image.convert("RGBA").getchannel("A"))
        return background
    return image.convert("RGB")


def transform(image: Image.Image, args: ImageTransformArgs, image_count: int = 1) -> torch.Tensor:
    """[3, H, W] float32 in [-1, 1] at `target_size` (bicubic, antialiased by Pillow's resampling)."""
    image = flatten_on_white(image)
    width, height = target_size(image.width, image.height, args, image_count)
    resized = image.resize((width, height), Image.Resampling.BICUBIC, reducing_gap=None)
    pixels = torch.from_numpy(np.asarray(resized, dtype=np.float32).copy()).permute(2, 0, 1)
    return pixels / 127.5 - 1.0


def num_tokens(width: int, height: int, stride: int) -> int:
    """Tokens of one image element (before the start/end tokens the packer adds)."""
    return (width * height) // (stride * stride)
