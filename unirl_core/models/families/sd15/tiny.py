"""The tiny SD 1.5 pipeline: StableDiffusionPipeline with UNet2DConditionModel (epsilon), CLIP, DDIM; about
0.28 M parameters."""

from __future__ import annotations

from unirl_core.models.tiny import CLIP_HIDDEN, byte_level_clip_tokenizer, clip_config, tiny_vae


def build_sd15():
    """A complete tiny StableDiffusionPipeline (UNet + DDIM, about 0.28 M parameters), no safety checker."""
    from diffusers import DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    clip_tokenizer = byte_level_clip_tokenizer()
    unet = UNet2DConditionModel(
        sample_size=16,
        in_channels=4,
        out_channels=4,
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=CLIP_HIDDEN,
        attention_head_dim=4,
        norm_num_groups=8,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return StableDiffusionPipeline(
        unet=unet,
        scheduler=scheduler,
        vae=tiny_vae(scaling_factor=0.18215),  # SD 1.x's value
        text_encoder=CLIPTextModel(clip_config(len(clip_tokenizer), projection=False)),
        tokenizer=clip_tokenizer,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
