"""BAGEL's deterministic image transform: the resize rule of FORMATS.md section 5, transparency on white, bicubic
resize with antialias, values in [-1, 1].

`target: bagel` (BAGEL's `MaxLongEdgeMinShortEdgeResize`, data/transforms.py; written from its rule, not its code):

    apply(w, h, s) = (fit(round(w * s)), fit(round(h * s)))      fit(v) = max(stride, int(round(v / stride) * stride))
    (w, h) = apply(w, h, max(min(max_size / max(w, h), 1), min_size / min(w, h)))
    if w * h > max_pixels / image_count: (w, h) = apply(w, h, (max_pixels / image_count) / (w * h))
    if max(w, h) > max_size:             (w, h) = apply(w, h, max_size / max(w, h))

The pixel-budget step scales the *sides* by the *area* ratio (three 1000x1000 images of a VLM sample at BAGEL's ViT
defaults: 686x686, not the 812x812 that fills the budget), and every step rounds to a whole pixel before the stride.
`target: unirl` scales the sides by the square root of the area ratio (the budget is filled, not undershot) and
rounds once, to the stride.

Transparency (`flatten_on_white`): BAGEL (`pil_img2rgb`) pastes on white an RGBA image or any image whose `info`
carries a transparency key (P, L or RGB with tRNS: the key colour becomes white) and converts the rest to RGB, so an
LA image loses its alpha (the grey shows, not white). `target: unirl` also pastes LA and PA images on white.

VAE images use stride 16 (VAE downsample 8 x latent patch 2), ViT images stride 14.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

TARGETS = ("bagel", "unirl")


@dataclass(frozen=True)
class ImageTransformArgs:
    """BAGEL's `image_transform_args` / `vit_image_transform_args` keys, and which target's rule applies."""

    image_stride: int = 16
    max_image_size: int = 1024
    min_image_size: int = 512
    max_pixels: int = 14 * 14 * 9 * 1024
    target: str = "bagel"

    def __post_init__(self):
        if self.image_stride < 1 or self.min_image_size < 1 or self.max_image_size < self.min_image_size:
            raise ValueError(
                f"image_transform_args: need image_stride >= 1 and 1 <= min_image_size <= max_image_size, got "
                f"stride {self.image_stride}, min {self.min_image_size}, max {self.max_image_size}"
            )
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")


def _round_to(side: float, stride: int) -> int:
    return max(stride, round(side / stride) * stride)


def _bagel_apply(width: int, height: int, scale: float, stride: int) -> tuple[int, int]:
    """BAGEL's `_apply_scale`: round to a whole pixel, then to the stride (at least one stride)."""
    return tuple(max(stride, int(round(round(side * scale) / stride) * stride)) for side in (width, height))


def _bagel_size(width: int, height: int, args: ImageTransformArgs, image_count: int) -> tuple[int, int]:
    stride, budget = args.image_stride, args.max_pixels / image_count
    scale = max(min(args.max_image_size / max(width, height), 1.0), args.min_image_size / min(width, height))
    w, h = _bagel_apply(width, height, scale, stride)
    if w * h > budget:
        w, h = _bagel_apply(w, h, budget / (w * h), stride)
    if max(w, h) > args.max_image_size:
        w, h = _bagel_apply(w, h, args.max_image_size / max(w, h), stride)
    return w, h


def _unirl_size(width: int, height: int, args: ImageTransformArgs, image_count: int) -> tuple[int, int]:
    stride = args.image_stride
    scale = max(min(args.max_image_size / max(width, height), 1.0), args.min_image_size / min(width, height))
    w, h = _round_to(width * scale, stride), _round_to(height * scale, stride)
    budget = args.max_pixels / image_count
    if w * h > budget:
        ratio = math.sqrt(budget / (w * h))
        w, h = _round_to(w * ratio, stride), _round_to(h * ratio, stride)
    if max(w, h) > args.max_image_size:
        ratio = args.max_image_size / max(w, h)
        w, h = _round_to(w * ratio, stride), _round_to(h * ratio, stride)
    return w, h


def target_size(width: int, height: int, args: ImageTransformArgs, image_count: int = 1) -> tuple[int, int]:
    """(width, height) after the target's rule above; both multiples of the stride."""
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height}: both sides must be at least 1 pixel")
    rule = _bagel_size if args.target == "bagel" else _unirl_size
    return rule(width, height, args, max(1, image_count))


def flatten_on_white(image: Image.Image, target: str = "bagel") -> Image.Image:
    """RGB. Transparent pixels become white: RGBA and images with a transparency key (both targets), LA and PA
    (`unirl` only: BAGEL drops their alpha)."""
    transparent = image.mode == "RGBA" or image.info.get("transparency") is not None
    if target == "unirl":
        transparent = transparent or image.mode in ("LA", "La", "PA")
    if not transparent:
        return image.convert("RGB")
    rgba = image.convert("RGBA")
    background = Image.new("RGB", image.size, (255, 255, 255))
    background.paste(rgba, mask=rgba.getchannel("A"))
    return background


def transform(image: Image.Image, args: ImageTransformArgs, image_count: int = 1) -> torch.Tensor:
    """[3, H, W] float32 in [-1, 1] at `target_size` (bicubic, antialiased by Pillow's resampling)."""
    image = flatten_on_white(image, args.target)
    width, height = target_size(image.width, image.height, args, image_count)
    resized = image.resize((width, height), Image.Resampling.BICUBIC, reducing_gap=None)
    pixels = torch.from_numpy(np.asarray(resized, dtype=np.float32).copy()).permute(2, 0, 1)
    return pixels / 127.5 - 1.0


def num_tokens(width: int, height: int, stride: int) -> int:
    """Tokens of one image element (before the start/end tokens the packer adds)."""
    return (width * height) // (stride * stride)
