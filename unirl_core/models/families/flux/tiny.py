"""Tiny FLUX.1 pipelines: the real classes (FluxTransformer2DModel with 2x2 latent packing, RoPE image/text ids and
the guidance embedding; CLIPTextModel's pooled output; T5EncoderModel; AutoencoderKL with FLUX's scaling and shift;
FlowMatchEulerDiscreteScheduler with FLUX's dynamic shifting) at shrunk sizes with random weights.

| family       | pipeline            | guidance embedding | scheduler                                   |
|--------------|---------------------|--------------------|---------------------------------------------|
| flux         | FluxPipeline        | yes (dev)          | dynamic shift (mu from the token count)     |
| flux_schnell | FluxPipeline        | no                 | shift 1, no dynamic shift                   |
| flux_kontext | FluxKontextPipeline | yes (Kontext-dev)  | dynamic shift                               |

The tiny VAE downsamples by 2 (not 8): a tiny latent token covers 2 x 2 = 4 pixels per side, so every size that is a
multiple of the real model's 16 also works here.
"""

from __future__ import annotations

from unirl_core.models.tiny import T5_HIDDEN, byte_level_clip_tokenizer, clip_config, tiny_t5_config, tiny_vae

VAE_CHANNELS = 4  # the tiny VAE's latent channels (FLUX.1's real VAE has 16)
T5_TOKENS = 64  # the tiny T5 tokenizer's model_max_length, which caps the family's max_sequence_length (real: 512)

# the published FLUX.1-dev / Kontext-dev scheduler config (scheduler/scheduler_config.json)
DEV_SCHEDULER = dict(
    base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15, num_train_timesteps=1000,
    shift=3.0, use_dynamic_shifting=True,
)  # fmt: skip
# FLUX.1-schnell's: no resolution-dependent shift
SCHNELL_SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)


def _components(guidance_embeds: bool, scheduler: dict) -> dict:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import ByT5Tokenizer, CLIPTextModel, T5EncoderModel

    clip_tokenizer = byte_level_clip_tokenizer()
    t5_tokenizer = ByT5Tokenizer(model_max_length=T5_TOKENS)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4 * VAE_CHANNELS,  # 2x2 patches of the VAE latent, packed
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=T5_HIDDEN,
        pooled_projection_dim=clip_config(len(clip_tokenizer), projection=False).hidden_size,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=(2, 2, 4),  # sums to attention_head_dim
    )
    t5_config = tiny_t5_config(len(t5_tokenizer))
    return dict(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(**scheduler),
        vae=tiny_vae(scaling_factor=0.3611, shift_factor=0.1159),  # FLUX.1's values
        text_encoder=CLIPTextModel(clip_config(len(clip_tokenizer), projection=False)),
        tokenizer=clip_tokenizer,
        text_encoder_2=T5EncoderModel(t5_config),
        tokenizer_2=t5_tokenizer,
    )


def build_flux():
    """A complete tiny FluxPipeline standing in for FLUX.1-dev (guidance-distilled, dynamic shift)."""
    from diffusers import FluxPipeline

    return FluxPipeline(**_components(guidance_embeds=True, scheduler=DEV_SCHEDULER))


def build_flux_schnell():
    """A tiny FluxPipeline standing in for FLUX.1-schnell (no guidance embedding, no dynamic shift)."""
    from diffusers import FluxPipeline

    return FluxPipeline(**_components(guidance_embeds=False, scheduler=SCHNELL_SCHEDULER))


def build_flux_kontext():
    """A tiny FluxKontextPipeline standing in for FLUX.1-Kontext-dev (FLUX.1-dev's architecture)."""
    from diffusers import FluxKontextPipeline

    return FluxKontextPipeline(**_components(guidance_embeds=True, scheduler=DEV_SCHEDULER))
