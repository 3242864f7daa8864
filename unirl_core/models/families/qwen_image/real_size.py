"""Qwen-Image's and Qwen-Image-Edit's published variants: components for `unirl plan` (transformer config in
family.py)."""

from __future__ import annotations

from unirl_core.models.components import QWEN25_VL_7B, family_denoiser

QWEN = {"text_encoder": QWEN25_VL_7B, "vae": ("diffusers", "AutoencoderKLQwenImage", None, {})}
VARIANTS: dict[str, dict] = {
    "qwen-image": {
        "family": "qwen_image", "text_tokens": 512,  # the cache's padding: batches are cut to their longest prompt
        "components": {"transformer": family_denoiser("qwen_image", "qwen-image", "QwenImageTransformer2DModel"),
                       **QWEN},
    },
    "qwen-image-edit": {
        "family": "qwen_image_edit", "text_tokens": 512, "reference_image": True,
        "components": {"transformer": family_denoiser("qwen_image_edit", "qwen-image-edit",
                                                       "QwenImageTransformer2DModel"), **QWEN},
    },
}  # fmt: skip
