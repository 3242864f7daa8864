"""FLUX.2-Klein's published variants (4B / 9B, distilled and base): components for `unirl plan` (transformer configs
in family.py)."""

from __future__ import annotations

from unirl_core.models.components import QWEN3_4B, QWEN3_8B, family_denoiser

KLEIN = {"vae": ("diffusers", "AutoencoderKLFlux2", None, {})}
VARIANTS: dict[str, dict] = {
    f"flux2-klein-{kind}{size}": {
        "family": "flux2_klein", "text_tokens": 512,
        "components": {"transformer": family_denoiser("flux2_klein", f"flux2-klein-{kind}{size}",
                                                       "Flux2Transformer2DModel"),
                       "text_encoder": QWEN3_4B if size == "4b" else QWEN3_8B, **KLEIN},
    } for kind in ("", "base-") for size in ("4b", "9b")
}  # fmt: skip
