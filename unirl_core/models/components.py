"""Published components shared by several families' real-size variants (`models/families/<f>/real_size.py`): each
as (library, class, config class or None, config), the config as in the Hugging Face model repo's config.json."""

from __future__ import annotations

CLIP_L = (
    "transformers",
    "CLIPTextModelWithProjection",
    "CLIPTextConfig",
    {
        "vocab_size": 49408,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "max_position_embeddings": 77,
        "projection_dim": 768,
        "hidden_act": "quick_gelu",
    },
)
CLIP_G = (
    "transformers",
    "CLIPTextModelWithProjection",
    "CLIPTextConfig",
    {
        "vocab_size": 49408,
        "hidden_size": 1280,
        "intermediate_size": 5120,
        "num_hidden_layers": 32,
        "num_attention_heads": 20,
        "max_position_embeddings": 77,
        "projection_dim": 1280,
        "hidden_act": "gelu",
    },
)
T5_XXL = (
    "transformers",
    "T5EncoderModel",
    "T5Config",
    {  # google/t5-v1_1-xxl, the encoder
        "vocab_size": 32128,
        "d_model": 4096,
        "d_kv": 64,
        "d_ff": 10240,
        "num_layers": 24,
        "num_heads": 64,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
    },
)
CLIP_L_PLAIN = (  # FLUX.1 and SDXL: CLIP-L without the projection
    "transformers", "CLIPTextModel", "CLIPTextConfig",
    {k: v for k, v in CLIP_L[3].items() if k != "projection_dim"},
)  # fmt: skip
QWEN25_VL_7B = (
    "transformers",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2_5_VLConfig",
    {  # Qwen-Image's
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "out_hidden_size": 3584,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
        "vocab_size": 152064,
        "hidden_size": 3584,
        "tie_word_embeddings": False,
    },
)
QWEN3_4B = (
    "transformers",
    "Qwen3ForCausalLM",
    "Qwen3Config",
    {  # FLUX.2-Klein 4B's
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
    },
)
QWEN3_8B = (
    "transformers",
    "Qwen3ForCausalLM",
    "Qwen3Config",
    {  # FLUX.2-Klein 9B's
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
    },
)
QWEN2_5_VL_7B = (
    "transformers",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2_5_VLConfig",
    {  # Qwen/Qwen2.5-VL-7B-Instruct's config.json
        "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                          "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                          "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2},
        "text_config": {"vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                        "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 128000,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}},
        "tie_word_embeddings": False,
    },
)  # fmt: skip
VAE_16 = (
    "diffusers",
    "AutoencoderKL",
    None,
    {  # SD3 / FLUX.1: 16 latent channels, no quant convs
        "block_out_channels": [128, 256, 512, 512],
        "layers_per_block": 2,
        "latent_channels": 16,
        "down_block_types": ["DownEncoderBlock2D"] * 4,
        "up_block_types": ["UpDecoderBlock2D"] * 4,
        "use_quant_conv": False,
        "use_post_quant_conv": False,
    },
)
VAE_4 = ("diffusers", "AutoencoderKL", None, {  # SD 1.x / SDXL: 4 latent channels
    "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "latent_channels": 4,
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4})  # fmt: skip


def family_denoiser(family: str, variant: str, class_name: str) -> tuple:
    """A denoiser whose published config the family file keeps (`denoiser_configs[variant]`)."""
    return ("diffusers", class_name, None, ("family", family, variant))
