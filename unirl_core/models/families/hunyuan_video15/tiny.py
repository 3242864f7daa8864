"""The tiny HunyuanVideo 1.5 pipeline: HunyuanVideo15Pipeline with the real classes, diffusers' own test sizes
(tests/pipelines/hunyuan_video1_5) for the transformer, and the published VAE's compression (16x spatial, 4x temporal)
so the family's strides hold for the tiny model too:

| piece          | tiny                                                  | real (480p_t2v)                               |
|----------------|-------------------------------------------------------|-----------------------------------------------|
| transformer    | 2 blocks, 1 refiner block, 2 heads x 8, mlp 2, 9 in   | 54 blocks, 2 refiner, 16 heads x 128, mlp 4,  |
|                | (4 noisy + 4 condition + 1 mask), rope (2, 2, 4)      | 65 in (32 + 32 + 1), rope (16, 56, 56)        |
| VAE            | 5 levels of width 16, 4 latent channels, 16x / 4x     | (128 ... 1024), 32 latent channels, 16x / 4x  |
| text encoder   | Qwen2.5-VL text model, 3 layers of width 16           | Qwen2.5-VL-7B's (28 layers of 3584)           |
| tokenizer      | byte-level BPE + the chat-template special tokens     | Qwen2's 151k BPE                              |
| glyph encoder  | T5 encoder, 1 layer of width 64, ByT5 tokenizer       | ByT5-small (Glyph-SDXL-v2), width 1472        |
| scheduler      | FlowMatchEuler, shift 5.0                             | the same                                      |
| guider         | ClassifierFreeGuidance, scale 6.0                     | the same                                      |

The pipeline takes the text encoder's third-last hidden state, so the tiny one has 3 layers (one of them counts).
The byte-level prompt template is ~520 tokens (the real one: 108, the pipeline's fixed crop), so the tiny embeddings
keep the template's tail; the stock pipeline and the family crop alike. 9 frames of 32 x 32 px are 3 latent frames of
2 x 2. About 4.9 M parameters, 4.2 M of them the transformer's ByT5 projection (its 2048 hidden width is fixed in
diffusers), 19 MB on disk.
"""

from __future__ import annotations

from unirl_core.models.families.qwen_image.tiny import byte_level_qwen_tokenizer
from unirl_core.models.tiny import T5_HIDDEN, tiny_t5_config

TEXT_HIDDEN = 16
LATENT_CHANNELS = 4
# Qwen2.5-VL's chat template for text-only messages (its vision branches dropped): what `apply_chat_template` renders
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_qwen_text_encoder(tokenizer):
    """A 3-layer Qwen2.5-VL text model (the pipeline's `text_encoder` class), mrope over head_dim 8."""
    from transformers import Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    ids = tokenizer.convert_tokens_to_ids
    return Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tokenizer), hidden_size=TEXT_HIDDEN, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]},
        bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
    ))  # fmt: skip


def tiny_hunyuan_video15_vae():
    """AutoencoderKLHunyuanVideo15 with the published compression (16x spatial: 4 downsampling levels of 5; 4x
    temporal) at width 16 and 4 latent channels."""
    from diffusers import AutoencoderKLHunyuanVideo15

    return AutoencoderKLHunyuanVideo15(
        latent_channels=LATENT_CHANNELS, block_out_channels=(16,) * 5, layers_per_block=1,
        spatial_compression_ratio=16, temporal_compression_ratio=4, downsample_match_channel=False,
        upsample_match_channel=False,
    )  # fmt: skip


def tiny_hunyuan_video15_transformer():
    """diffusers' test transformer (2 blocks): input channels = noisy latents + condition latents + 1 mask."""
    from diffusers import HunyuanVideo15Transformer3DModel

    return HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT_CHANNELS + 1, out_channels=LATENT_CHANNELS, num_attention_heads=2,
        attention_head_dim=8, num_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
        text_embed_dim=TEXT_HIDDEN, text_embed_2_dim=T5_HIDDEN, image_embed_dim=12, rope_axes_dim=(2, 2, 4),
        target_size=32, task_type="t2v",
    )  # fmt: skip


def build_hunyuan_video15():
    """A complete tiny HunyuanVideo15Pipeline (text-to-video)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, T5EncoderModel

    tokenizer, tokenizer_2 = byte_level_qwen_tokenizer(), ByT5Tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    return HunyuanVideo15Pipeline(
        text_encoder=tiny_qwen_text_encoder(tokenizer), tokenizer=tokenizer,
        transformer=tiny_hunyuan_video15_transformer(), vae=tiny_hunyuan_video15_vae(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
        text_encoder_2=T5EncoderModel(tiny_t5_config(len(tokenizer_2))), tokenizer_2=tokenizer_2,
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )  # fmt: skip
