"""Wan's published variants (Wan-AI/Wan2.1-T2V-1.3B-Diffusers, -T2V-14B-, -I2V-14B-480P-, Wan2.2-T2V-A14B-Diffusers,
Wan2.2-TI2V-5B-Diffusers): components for `unirl plan`, the configs as in their repos' config.json files (the VAE's
latent statistics, buffers that do not change its size, left at placeholders)."""

from __future__ import annotations

UMT5_XXL = ("transformers", "UMT5EncoderModel", "UMT5Config", {  # google/umt5-xxl's encoder
    "vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240, "num_layers": 24, "num_heads": 64,
    "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
})  # fmt: skip
WAN_VAE = ("diffusers", "AutoencoderKLWan", None, {})  # base_dim 96, z_dim 16: the class defaults
_TRANSFORMER = {"patch_size": [1, 2, 2], "attention_head_dim": 128, "in_channels": 16, "out_channels": 16,
                "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
                "eps": 1e-6, "rope_max_seq_len": 1024}  # fmt: skip


CLIP_H_VISION = ("transformers", "CLIPVisionModel", "CLIPVisionConfig", {  # Wan 2.1 I2V's image_encoder (ViT-H/14)
    "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_attention_heads": 16,
    "patch_size": 14, "image_size": 224, "hidden_act": "gelu", "projection_dim": 1024,
})  # fmt: skip


def _wan(heads: int, ffn: int, layers: int, family: str = "wan", experts: int = 1, **extra) -> dict:
    transformer = (
        "diffusers",
        "WanTransformer3DModel",
        None,
        {**_TRANSFORMER, "num_attention_heads": heads, "ffn_dim": ffn, "num_layers": layers, **extra},
    )
    names = ["transformer", "transformer_2"][:experts]
    return {
        "family": family, "text_tokens": 512,  # the pipeline pads umT5's embeddings to 512
        "components": {**dict.fromkeys(names, transformer), "text_encoder": UMT5_XXL, "vae": WAN_VAE},
    }  # fmt: skip


VARIANTS: dict[str, dict] = {
    "wan2.1-t2v-1.3b": _wan(heads=12, ffn=8960, layers=30),
    "wan2.1-t2v-14b": _wan(heads=40, ffn=13824, layers=40),
    "wan2.1-i2v-14b-480p": {
        **_wan(
            heads=40, ffn=13824, layers=40, family="wan_i2v", in_channels=36, image_dim=1280, added_kv_proj_dim=5120
        ),
        "reference_image": False,
    },
    "wan2.2-t2v-a14b": _wan(heads=40, ffn=13824, layers=40, family="wan2_2", experts=2),
    "wan2.2-ti2v-5b": _wan(heads=24, ffn=14336, layers=30, family="wan_ti2v", in_channels=48, out_channels=48),
}
VARIANTS["wan2.2-ti2v-5b"]["components"]["vae"] = ("diffusers", "AutoencoderKLWan", None, {  # Wan2.2_VAE
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2,
    "temperal_downsample": [False, True, True], "is_residual": True, "in_channels": 12, "out_channels": 12,
    "patch_size": 2, "scale_factor_spatial": 16, "scale_factor_temporal": 4, "latents_mean": [0.0] * 48,
    "latents_std": [1.0] * 48,
})  # fmt: skip
VARIANTS["wan2.1-i2v-14b-480p"]["components"]["image_encoder"] = CLIP_H_VISION
