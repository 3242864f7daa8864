"""The tiny SD3 pipeline: StableDiffusion3Pipeline with SD3Transformer2DModel (flow matching), 2 x CLIP with
projection + T5, FlowMatchEuler; about 0.23 M parameters."""

from __future__ import annotations

from unirl_core.models.tiny import (
    CLIP_HIDDEN,
    T5_HIDDEN,
    byte_level_clip_tokenizer,
    clip_config,
    tiny_t5_config,
    tiny_vae,
)


def build_sd3():
    """A complete tiny StableDiffusion3Pipeline (about 0.23 M parameters, 1.1 MB on disk)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import ByT5Tokenizer, CLIPTextModelWithProjection, T5EncoderModel

    clip_tokenizer = byte_level_clip_tokenizer()
    t5_tokenizer = ByT5Tokenizer()
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=T5_HIDDEN,
        caption_projection_dim=32,
        pooled_projection_dim=2 * CLIP_HIDDEN,
        pos_embed_max_size=32,
    )
    t5_config = tiny_t5_config(len(t5_tokenizer))
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=tiny_vae(scaling_factor=1.5305, shift_factor=0.0609),  # SD3's values
        text_encoder=CLIPTextModelWithProjection(clip_config(len(clip_tokenizer), projection=True)),
        tokenizer=clip_tokenizer,
        text_encoder_2=CLIPTextModelWithProjection(clip_config(len(clip_tokenizer), projection=True)),
        tokenizer_2=byte_level_clip_tokenizer(),
        text_encoder_3=T5EncoderModel(t5_config),
        tokenizer_3=t5_tokenizer,
    )
