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

# variant -> family, components {name: (library, class, config class or None, config)}, conditioning tokens
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
}  # fmt: skip


class UnknownVariantError(ValueError):
    """A variant name that is not in VARIANTS (and not a pipeline folder)."""


def variant_names(family: str | None = None) -> list[str]:
    return sorted(name for name, v in VARIANTS.items() if family is None or v["family"] == family)


def _build(library: str, class_name: str, config_class: str | None, config: dict) -> torch.nn.Module:
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
