"""HunyuanVideo 1.5's published text-to-video variant (hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v):
components for `unirl plan`, the configs as diffusers' conversion script (scripts/convert_hunyuan_video1_5_to_diffusers.py,
`480p_t2v`) writes them. The 720p variant differs only in `target_size` (960) and the scheduler's shift (9.0)."""

from __future__ import annotations

TRANSFORMER_480P_T2V = {  # the class defaults, as a t2v model
    "in_channels": 65, "out_channels": 32, "num_attention_heads": 16, "attention_head_dim": 128, "num_layers": 54,
    "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 1, "patch_size_t": 1, "qk_norm": "rms_norm",
    "text_embed_dim": 3584, "text_embed_2_dim": 1472, "image_embed_dim": 1152, "rope_theta": 256.0,
    "rope_axes_dim": [16, 56, 56], "use_meanflow": False, "target_size": 640, "task_type": "t2v",
}  # fmt: skip
QWEN25_VL_7B_TEXT = ("transformers", "Qwen2_5_VLTextModel", "Qwen2_5_VLTextConfig", {  # Qwen2.5-VL-7B's language model
    "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 128000,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
})  # fmt: skip
# google/byt5-small's encoder with Glyph-SDXL-v2's weights (its color and font tokens add ~1 k embedding rows: < 2 M
# parameters, left out)
BYT5_SMALL = ("transformers", "T5EncoderModel", "T5Config", {
    "vocab_size": 384, "d_model": 1472, "d_kv": 64, "d_ff": 3584, "num_layers": 12, "num_heads": 6,
    "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
})  # fmt: skip

VARIANTS: dict[str, dict] = {
    "hunyuanvideo-1.5-480p-t2v": {
        "family": "hunyuan_video15",
        "text_tokens": 1256,  # Qwen2.5-VL's 1000 + ByT5's 256 (padded; a batch is cut to its longest prompt)
        "components": {
            "transformer": ("diffusers", "HunyuanVideo15Transformer3DModel", None, TRANSFORMER_480P_T2V),
            "vae": ("diffusers", "AutoencoderKLHunyuanVideo15", None, {}),  # the class defaults
            "text_encoder": QWEN25_VL_7B_TEXT,
            "text_encoder_2": BYT5_SMALL,
        },
    },
}
