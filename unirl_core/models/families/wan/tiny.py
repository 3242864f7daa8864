"""The tiny Wan 2.1 pipeline: WanPipeline with the real classes and diffusers' own test sizes (tests/pipelines/wan):

| piece        | tiny                                                    | real (Wan-AI/Wan2.1-T2V-1.3B-Diffusers)      |
|--------------|---------------------------------------------------------|----------------------------------------------|
| transformer  | 2 blocks, 2 heads x 12, ffn 32, text_dim 64, 16 in      | 30 blocks, 12 heads x 128, ffn 8960, 4096    |
| VAE          | base_dim 3, z_dim 16, 8x spatial, 4x temporal            | base_dim 96, z_dim 16, 8x, 4x                |
| text encoder | umT5, 1 layer of width 64                                | umT5-XXL (4096 wide)                         |
| tokenizer    | ByT5's (bytes, no files)                                 | umT5's SentencePiece                         |
| scheduler    | FlowMatchEuler, shift 3.0                                | UniPC (flow sigmas, flow_shift 3.0)          |

Frames satisfy (F - 1) % 4 == 0 and sides are multiples of 16 (VAE 8 x patch 2): 9 frames of 32 x 32 px are 3
latent frames of 4 x 4, 12 tokens. About 0.13 M parameters.
"""

from __future__ import annotations

from unirl_core.models.tiny import T5_HIDDEN


def tiny_umt5(vocab_size: int, width: int = T5_HIDDEN):
    """A 1-layer umT5 encoder of `width` (Wan's text encoder class; 4096: the real conditioning width)."""
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(
        UMT5Config(vocab_size=vocab_size, d_model=width, d_kv=8, d_ff=64, num_layers=1, num_heads=4,
                   relative_attention_num_buckets=8, decoder_start_token_id=0)
    )  # fmt: skip


def tiny_wan_vae():
    """diffusers' test AutoencoderKLWan: 8x spatial and 4x temporal compression, z_dim 16."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                            temperal_downsample=[False, True, True])  # fmt: skip


def tiny_wan_transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=T5_HIDDEN, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )  # fmt: skip


def build_wan():
    """A complete tiny WanPipeline (text-to-video)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    return WanPipeline(
        tokenizer=tokenizer, text_encoder=tiny_umt5(len(tokenizer)), vae=tiny_wan_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=tiny_wan_transformer(),
    )  # fmt: skip


def build_wan_i2v():
    """A complete tiny WanImageToVideoPipeline (Wan 2.1 I2V): the T2V parts, a transformer of 36 input channels
    reading CLIP image features (`image_dim`), and a tiny CLIPVisionModel with its image processor."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import ByT5Tokenizer, CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    tokenizer = ByT5Tokenizer()
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=36, out_channels=16,
        text_dim=T5_HIDDEN, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32, image_dim=16,
    )  # fmt: skip
    vision = CLIPVisionModel(CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, image_size=32, patch_size=8))  # fmt: skip
    return WanImageToVideoPipeline(
        tokenizer=tokenizer, text_encoder=tiny_umt5(len(tokenizer)), vae=tiny_wan_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=transformer, image_encoder=vision,
        image_processor=CLIPImageProcessor(crop_size=32, size=32),
    )  # fmt: skip


def build_wan2_2():
    """A complete tiny Wan 2.2 A14B-style WanPipeline: two experts (`transformer` for timesteps >= 875 of 1000,
    `transformer_2` below), boundary_ratio 0.875 as the published A14B T2V's."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    return WanPipeline(
        tokenizer=tokenizer, text_encoder=tiny_umt5(len(tokenizer)), vae=tiny_wan_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=tiny_wan_transformer(),
        transformer_2=tiny_wan_transformer(), boundary_ratio=0.875,
    )  # fmt: skip


def build_wan_ti2v():
    """A complete tiny Wan 2.2 TI2V-5B-style WanPipeline (`expand_timesteps`): diffusers' test sizes for its
    high-compression VAE (z_dim 48 over 2x2-patchified pixels, 16x spatial, 4x temporal) and a transformer of 48
    channels."""
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import ByT5Tokenizer

    tokenizer = ByT5Tokenizer()
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=48, in_channels=12, out_channels=12, is_residual=True, patch_size=2, dim_mult=[1, 1, 1, 1],
        num_res_blocks=1, scale_factor_spatial=16, scale_factor_temporal=4, temperal_downsample=[False, True, True],
        latents_mean=[0.0] * 48, latents_std=[1.0] * 48,
    )  # fmt: skip
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=48, out_channels=48,
        text_dim=T5_HIDDEN, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
    )  # fmt: skip
    return WanPipeline(
        tokenizer=tokenizer, text_encoder=tiny_umt5(len(tokenizer)), vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), transformer=transformer, expand_timesteps=True,
    )  # fmt: skip
