"""FLUX.1's published variants (dev, schnell, Kontext-dev): components for `unirl plan` (transformer configs in
family.py)."""

from __future__ import annotations

from unirl_core.models.components import CLIP_L_PLAIN, T5_XXL, VAE_16, family_denoiser

FLUX1 = {"text_encoder": CLIP_L_PLAIN, "text_encoder_2": T5_XXL, "vae": VAE_16}
VARIANTS: dict[str, dict] = {
    "flux1-dev": {
        "family": "flux", "text_tokens": 512,
        "components": {"transformer": family_denoiser("flux", "flux1-dev", "FluxTransformer2DModel"), **FLUX1},
    },
    "flux1-schnell": {
        "family": "flux_schnell", "text_tokens": 256,
        "components": {"transformer": family_denoiser("flux_schnell", "flux1-schnell", "FluxTransformer2DModel"),
                       **FLUX1},
    },
    "flux1-kontext-dev": {
        "family": "flux_kontext", "text_tokens": 512, "reference_image": True,
        "components": {"transformer": family_denoiser("flux_kontext", "flux1-kontext-dev", "FluxTransformer2DModel"),
                       **FLUX1},
    },
}  # fmt: skip
