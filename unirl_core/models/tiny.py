"""Tiny models: real diffusers/transformers architectures with random weights, built from config.

They exercise exactly the code real models go through (`save_pretrained`, then `from_pretrained(folder)`,
offline), in seconds on a CPU. Tokenizers are built in memory: a byte-level CLIP vocabulary (every byte is a
token, so any text encodes without unknown tokens) and ByT5's tokenizer (no files at all) for T5.

| family | pipeline                  | denoiser                           | text encoders                      | scheduler        |
|--------|---------------------------|------------------------------------|------------------------------------|------------------|
| sd3    | StableDiffusion3Pipeline  | SD3Transformer2DModel (flow match) | 2 x CLIP with projection + T5      | FlowMatchEuler   |
| sd15   | StableDiffusionPipeline   | UNet2DConditionModel (epsilon)     | CLIP                               | DDIM             |
"""

from __future__ import annotations

CLIP_MAX_LENGTH = 77
CLIP_HIDDEN = 32
T5_HIDDEN = 2 * CLIP_HIDDEN  # SD3 pads the concatenated CLIP embeddings (2 x 32) up to the T5 width


def byte_level_clip_tokenizer(special_tokens_last: bool = False, max_length: int = CLIP_MAX_LENGTH):
    """A CLIPTokenizer whose vocabulary is the 256 byte symbols (plain and word-final) and no merges.

    `special_tokens_last`: <|startoftext|> and <|endoftext|> take the two highest ids, as in CLIP's own vocabulary
    (open_clip pools at the highest id; OWL ignores a query whose first id is 0), and padding is id 0 ("!"), as
    open_clip pads. Otherwise they come first and pad with <|endoftext|>."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    special = ["<|startoftext|>", "<|endoftext|>"]
    byte_tokens = [*symbols, *(s + "</w>" for s in symbols)]
    tokens = [*byte_tokens, *special] if special_tokens_last else [*special, *byte_tokens]
    return CLIPTokenizer(
        vocab={token: i for i, token in enumerate(tokens)},
        merges=[],
        model_max_length=max_length,
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token=symbols[0] if special_tokens_last else "<|endoftext|>",
    )


def _clip_config(vocab_size: int, projection: bool):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=CLIP_HIDDEN,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CLIP_MAX_LENGTH,
        projection_dim=CLIP_HIDDEN if projection else 512,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        hidden_act="gelu",
    )


def tiny_t5_config(vocab_size: int):
    """A 1-layer T5 encoder config of width T5_HIDDEN (SD3's and FLUX.1's T5 stand-in)."""
    from transformers import T5Config

    return T5Config(
        vocab_size=vocab_size,
        d_model=T5_HIDDEN,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        decoder_start_token_id=0,
    )


def _tiny_vae(scaling_factor: float, shift_factor: float | None = None):
    """A 2-block AutoencoderKL (downsamples by 2) with the latent scaling of the family it stands in for."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
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
        vae=_tiny_vae(scaling_factor=1.5305, shift_factor=0.0609),  # SD3's values
        text_encoder=CLIPTextModelWithProjection(_clip_config(len(clip_tokenizer), projection=True)),
        tokenizer=clip_tokenizer,
        text_encoder_2=CLIPTextModelWithProjection(_clip_config(len(clip_tokenizer), projection=True)),
        tokenizer_2=byte_level_clip_tokenizer(),
        text_encoder_3=T5EncoderModel(t5_config),
        tokenizer_3=t5_tokenizer,
    )


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
        vae=_tiny_vae(scaling_factor=0.18215),  # SD 1.x's value
        text_encoder=CLIPTextModel(_clip_config(len(clip_tokenizer), projection=False)),
        tokenizer=clip_tokenizer,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
