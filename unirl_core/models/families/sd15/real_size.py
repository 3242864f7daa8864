"""SD 1.5's published variant: components for `unirl plan`."""

from __future__ import annotations

from unirl_core.models.components import VAE_4

VARIANTS: dict[str, dict] = {
    "sd1.5": {
        "family": "sd15",
        "text_tokens": 77,
        "components": {
            "unet": ("diffusers", "UNet2DConditionModel", None, {"cross_attention_dim": 768, "sample_size": 64}),
            "text_encoder": ("transformers", "CLIPTextModel", "CLIPTextConfig", {
                "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                "num_attention_heads": 12, "max_position_embeddings": 77, "hidden_act": "quick_gelu"}),
            "vae": VAE_4,
        },
    },
}  # fmt: skip
