"""SDXL base 1.0's published variant: components for `unirl plan` (the UNet's config is in family.py)."""

from __future__ import annotations

from unirl_core.models.components import CLIP_G, CLIP_L_PLAIN, VAE_4, family_denoiser

VARIANTS: dict[str, dict] = {
    "sdxl-base-1.0": {
        "family": "sdxl", "text_tokens": 77,
        "components": {"unet": family_denoiser("sdxl", "sdxl-base-1.0", "UNet2DConditionModel"),
                       "text_encoder": CLIP_L_PLAIN, "text_encoder_2": CLIP_G, "vae": VAE_4},
    },
}  # fmt: skip
