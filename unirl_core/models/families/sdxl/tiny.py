"""The tiny StableDiffusionXLPipeline: SDXL's classes and wiring (two CLIP encoders, a "text_time" UNet, Euler with
SDXL's betas, the 0.13025 VAE scaling) at test size, random weights.

| part           | SDXL base 1.0                                   | tiny                                             |
|----------------|-------------------------------------------------|--------------------------------------------------|
| text encoders  | CLIP-L (768) + bigG with projection (1280)      | 2 x CLIP hidden 32, the second with projection 32 |
| cross-attn dim | 768 + 1280 = 2048 (penultimate states, concat)  | 32 + 32 = 64                                     |
| added cond     | pooled 1280 + 6 time ids x 256 = 2816           | pooled 32 + 6 x 8 = 80                           |
| UNet blocks    | (320, 640, 1280), transformers (1, 2, 10)       | (16, 32), transformers (1, 1)                    |
| VAE            | stride 8, scaling 0.13025, force_upcast         | stride 2, scaling 0.13025, force_upcast          |
| scheduler      | EulerDiscrete, scaled_linear 0.00085-0.012, leading, steps_offset 1 (the same)   |
"""

from __future__ import annotations

from unirl_core.models.tiny import CLIP_HIDDEN, byte_level_clip_tokenizer, clip_config, tiny_vae

ADDITION_TIME_EMBED_DIM = 8
NUM_TIME_IDS = 6  # original_size (2) + crops_coords_top_left (2) + target_size (2)
# stabilityai/stable-diffusion-xl-base-1.0 scheduler/scheduler_config.json, verbatim: the keys Euler does not use
# (clip_sample, set_alpha_to_one, ...) are kept in its config and are what `DDIMScheduler.from_config` reads
SDXL_SCHEDULER_CONFIG = {
    "_class_name": "EulerDiscreteScheduler",
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "beta_start": 0.00085,
    "clip_sample": False,
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "epsilon",
    "sample_max_value": 1.0,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "trained_betas": None,
    "use_karras_sigmas": False,
}


def build_sdxl():
    """A complete tiny StableDiffusionXLPipeline (about 0.38 M parameters, the UNet 0.27 M), no watermarker, no
    IP-Adapter image encoder."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = byte_level_clip_tokenizer()
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),  # SDXL: no attention at the highest resolution
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        transformer_layers_per_block=(1, 1),
        cross_attention_dim=2 * CLIP_HIDDEN,  # the two encoders' hidden states, concatenated
        attention_head_dim=(2, 4),  # diffusers' UNet reads this as the number of heads
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=ADDITION_TIME_EMBED_DIM,
        projection_class_embeddings_input_dim=CLIP_HIDDEN + NUM_TIME_IDS * ADDITION_TIME_EMBED_DIM,
        norm_num_groups=8,
    )
    scheduler = EulerDiscreteScheduler.from_config(SDXL_SCHEDULER_CONFIG)
    return StableDiffusionXLPipeline(
        vae=tiny_vae(scaling_factor=0.13025),  # SDXL's value
        text_encoder=CLIPTextModel(clip_config(len(tokenizer), projection=False)),
        text_encoder_2=CLIPTextModelWithProjection(clip_config(len(tokenizer), projection=True)),
        tokenizer=tokenizer,
        tokenizer_2=byte_level_clip_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,  # SDXL base's setting
        add_watermarker=False,
    )
