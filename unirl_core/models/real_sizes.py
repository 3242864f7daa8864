"""Real model sizes without weights: each variant's components as published (class and config), built on the meta
device by `unirl plan` to count parameters and estimate memory, in seconds and without a download.

    meta_pipeline("sd3.5-medium")     -> {"transformer": <meta SD3Transformer2DModel>, "text_encoder": ..., ...}
    meta_pipeline("/models/flux-dev") -> the same from a pipeline folder's config.json files (no weights read)

The configs are the published `config.json` values of each component (Hugging Face model repos); the parameter
counts they give are checked against the published totals in tests/unit/test_memory_plan.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

_CLIP_L = (
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
_CLIP_G = (
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
_T5_XXL = (
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
_CLIP_L_PLAIN = (  # FLUX.1 and SDXL: CLIP-L without the projection
    "transformers", "CLIPTextModel", "CLIPTextConfig",
    {k: v for k, v in _CLIP_L[3].items() if k != "projection_dim"},
)  # fmt: skip
_QWEN25_VL_7B = (
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
_QWEN3_4B = (
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
_QWEN3_8B = (
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
_VAE_16 = (
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
_VAE_4 = ("diffusers", "AutoencoderKL", None, {  # SD 1.x / SDXL: 4 latent channels
    "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "latent_channels": 4,
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4})  # fmt: skip


def _family_denoiser(family: str, variant: str, class_name: str) -> tuple:
    """A denoiser whose published config the family file keeps (`denoiser_configs[variant]`)."""
    return ("diffusers", class_name, None, ("family", family, variant))


_FLUX1 = {"text_encoder": _CLIP_L_PLAIN, "text_encoder_2": _T5_XXL, "vae": _VAE_16}
_QWEN = {"text_encoder": _QWEN25_VL_7B, "vae": ("diffusers", "AutoencoderKLQwenImage", None, {})}
_KLEIN = {"vae": ("diffusers", "AutoencoderKLFlux2", None, {})}

# variant -> family, components {name: (library, class, config class or None, config)}, conditioning tokens (the
# text's; `reference_image`: an edit model's condition image adds as many tokens as the image)
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
            "text_encoder": _CLIP_L, "text_encoder_2": _CLIP_G, "text_encoder_3": _T5_XXL, "vae": _VAE_16,
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
            "text_encoder": _CLIP_L, "text_encoder_2": _CLIP_G, "text_encoder_3": _T5_XXL, "vae": _VAE_16,
        },
    },
    "sd1.5": {
        "family": "sd15",
        "text_tokens": 77,
        "components": {
            "unet": ("diffusers", "UNet2DConditionModel", None, {"cross_attention_dim": 768, "sample_size": 64}),
            "text_encoder": ("transformers", "CLIPTextModel", "CLIPTextConfig", {
                "vocab_size": 49408, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                "num_attention_heads": 12, "max_position_embeddings": 77, "hidden_act": "quick_gelu"}),
            "vae": _VAE_4,
        },
    },
    "sdxl-base-1.0": {
        "family": "sdxl", "text_tokens": 77,
        "components": {"unet": _family_denoiser("sdxl", "sdxl-base-1.0", "UNet2DConditionModel"),
                       "text_encoder": _CLIP_L_PLAIN, "text_encoder_2": _CLIP_G, "vae": _VAE_4},
    },
    "flux1-dev": {
        "family": "flux", "text_tokens": 512,
        "components": {"transformer": _family_denoiser("flux", "flux1-dev", "FluxTransformer2DModel"), **_FLUX1},
    },
    "flux1-schnell": {
        "family": "flux_schnell", "text_tokens": 256,
        "components": {"transformer": _family_denoiser("flux_schnell", "flux1-schnell", "FluxTransformer2DModel"),
                       **_FLUX1},
    },
    "flux1-kontext-dev": {
        "family": "flux_kontext", "text_tokens": 512, "reference_image": True,
        "components": {"transformer": _family_denoiser("flux_kontext", "flux1-kontext-dev", "FluxTransformer2DModel"),
                       **_FLUX1},
    },
    "qwen-image": {
        "family": "qwen_image", "text_tokens": 512,  # the cache's padding: batches are cut to their longest prompt
        "components": {"transformer": _family_denoiser("qwen_image", "qwen-image", "QwenImageTransformer2DModel"),
                       **_QWEN},
    },
    "qwen-image-edit": {
        "family": "qwen_image_edit", "text_tokens": 512, "reference_image": True,
        "components": {"transformer": _family_denoiser("qwen_image_edit", "qwen-image-edit",
                                                       "QwenImageTransformer2DModel"), **_QWEN},
    },
    **{f"flux2-klein-{kind}{size}": {
        "family": "flux2_klein", "text_tokens": 512,
        "components": {"transformer": _family_denoiser("flux2_klein", f"flux2-klein-{kind}{size}",
                                                       "Flux2Transformer2DModel"),
                       "text_encoder": _QWEN3_4B if size == "4b" else _QWEN3_8B, **_KLEIN},
    } for kind in ("", "base-") for size in ("4b", "9b")},
}  # fmt: skip


class UnknownVariantError(ValueError):
    """A variant name that is not in VARIANTS (and not a pipeline folder)."""


def variant_names(family: str | None = None) -> list[str]:
    return sorted(name for name, v in VARIANTS.items() if family is None or v["family"] == family)


def _build(library: str, class_name: str, config_class: str | None, config) -> torch.nn.Module:
    if isinstance(config, tuple):  # ("family", name, variant): the family file's published config
        from unirl_core.models.registry import family_class

        config = family_class(config[1]).denoiser_configs[config[2]]
    module = __import__(library)
    cls = getattr(module, class_name)
    if library == "transformers":
        return cls(getattr(module, config_class)(**config))
    return cls.from_config(config)


def meta_pipeline(source: str) -> dict[str, torch.nn.Module]:
    """The components (nn.Modules only) of a variant, or of a pipeline folder from its configs, on the meta device."""
    if source in VARIANTS:
        specs = VARIANTS[source]["components"]
    elif (Path(source) / "model_index.json").is_file():
        specs = _folder_specs(Path(source))
    else:
        raise UnknownVariantError(
            f"model {source!r} is neither a pipeline folder (with model_index.json) nor a known variant; "
            f"variants: {', '.join(variant_names())}"
        )
    with torch.device("meta"):
        return {name: _build(*spec) for name, spec in specs.items()}


def _folder_specs(folder: Path) -> dict[str, tuple]:
    import transformers

    specs = {}
    for name, entry in json.loads((folder / "model_index.json").read_text()).items():
        if not (isinstance(entry, list) and entry[0] in ("diffusers", "transformers") and entry[1]):
            continue
        library, class_name = entry
        config_file = folder / name / "config.json"
        if not config_file.is_file():
            continue  # tokenizers, schedulers, processors: no weights
        if library == "transformers":
            config = transformers.AutoConfig.from_pretrained(str(folder / name))
            specs[name] = (library, class_name, type(config).__name__, config.to_diff_dict())
        else:
            config = json.loads(config_file.read_text())
            specs[name] = (library, class_name, None, {k: v for k, v in config.items() if not k.startswith("_")})
    return specs


def parameter_count(module: torch.nn.Module) -> int:
    """Parameters plus buffers (fixed position embeddings are buffers and take memory too)."""
    return sum(p.numel() for p in module.parameters()) + sum(b.numel() for b in module.buffers())
