"""SD3.5's published variants (stabilityai/stable-diffusion-3.5-medium and -large): components for `unirl plan`."""

from __future__ import annotations

from unirl_core.models.components import CLIP_G, CLIP_L, T5_XXL, VAE_16

VARIANTS: dict[str, dict] = {
    "sd3.5-medium": {
        "family": "sd3",
        "text_tokens": 77 + 256,  # CLIP 77 + T5 256 (diffusers' default max_sequence_length)
        "components": {
            "transformer": ("diffusers", "SD3Transformer2DModel", None, {
                "sample_size": 128, "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 24,
                "attention_head_dim": 64, "num_attention_heads": 24, "joint_attention_dim": 4096,
                "caption_projection_dim": 1536, "pooled_projection_dim": 2048, "pos_embed_max_size": 384,
                "dual_attention_layers": list(range(13)), "qk_norm": "rms_norm"}),
            "text_encoder": CLIP_L, "text_encoder_2": CLIP_G, "text_encoder_3": T5_XXL, "vae": VAE_16,
        },
    },
    "sd3.5-large": {
        "family": "sd3",
        "text_tokens": 77 + 256,
        "components": {
            "transformer": ("diffusers", "SD3Transformer2DModel", None, {
                "sample_size": 128, "patch_size": 2, "in_channels": 16, "out_channels": 16, "num_layers": 38,
                "attention_head_dim": 64, "num_attention_heads": 38, "joint_attention_dim": 4096,
                "caption_projection_dim": 2432, "pooled_projection_dim": 2048, "pos_embed_max_size": 192,
                "qk_norm": "rms_norm"}),
            "text_encoder": CLIP_L, "text_encoder_2": CLIP_G, "text_encoder_3": T5_XXL, "vae": VAE_16,
        },
    },
}  # fmt: skip
