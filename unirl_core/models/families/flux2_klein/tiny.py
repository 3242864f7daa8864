"""The tiny FLUX.2-Klein pipeline: the real classes (`Flux2Transformer2DModel`, `Qwen3ForCausalLM`,
`Qwen2TokenizerFast` with a chat template, `AutoencoderKLFlux2` with its batch-norm statistics,
`FlowMatchEulerDiscreteScheduler` with dynamic shifting) at toy sizes with random weights.

| component    | real (klein-4B)                          | tiny                                               |
|--------------|------------------------------------------|----------------------------------------------------|
| transformer  | 5 double + 20 single blocks, 24 x 128    | 1 double + 1 single block, 2 heads x 8 (rope 2x4)  |
| text encoder | Qwen3-4B (36 layers, hidden 2560)        | Qwen3, 28 layers of hidden 32: layers 9, 18, 27 read |
| tokenizer    | Qwen2 BPE + Qwen3 chat template          | byte-level BPE (256 bytes, no merges), same template |
| VAE          | 32 latent channels, stride 8, bn stats   | 2 latent channels, stride 2, random bn stats       |

The text encoder keeps 28 layers (of a few thousand parameters each) so that the pipeline's default
`text_encoder_out_layers=(9, 18, 27)` reads the same layers in the tiny as in the real model.
"""

from __future__ import annotations

TEXT_HIDDEN = 32
TEXT_LAYERS = 28  # the pipeline reads hidden_states[9], [18], [27]
LATENT_CHANNELS = 2  # x 4 after the 2x2 patchify: the transformer's 8 input channels

# Qwen3's chat template for what the pipeline sends (one user message, the generation prompt, thinking off)
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def byte_level_qwen2_tokenizer():
    """A Qwen2TokenizerFast whose vocabulary is the 256 byte symbols (no merges) plus Qwen's special tokens."""
    from tokenizers import AddedToken
    from transformers import Qwen2TokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    tokenizer = Qwen2TokenizerFast(vocab=vocab, merges=[], model_max_length=96)
    tokenizer.add_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>")])
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer


def _tiny_qwen3(vocab_size: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=TEXT_HIDDEN,
        intermediate_size=48,
        num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config)


def _tiny_flux2_vae():
    """A 2-block AutoencoderKLFlux2 (stride 2) whose batch-norm running statistics are not the identity, so the
    normalization the pipeline applies is exercised."""
    import torch
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        block_out_channels=(8, 16),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=4,
        sample_size=32,
        mid_block_add_attention=False,
    )
    channels = vae.bn.num_features
    vae.bn.running_mean.copy_(0.1 * torch.randn(channels))
    vae.bn.running_var.copy_(0.5 + torch.rand(channels))
    return vae


def build_flux2_klein(is_distilled: bool = False):
    """A complete tiny Flux2KleinPipeline (the base, non-distilled variant unless `is_distilled`)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Transformer2DModel

    tokenizer = byte_level_qwen2_tokenizer()
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=4 * LATENT_CHANNELS,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=3 * TEXT_HIDDEN,
        timestep_guidance_channels=16,
        axes_dims_rope=(2, 2, 2, 2),
        guidance_embeds=False,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(  # the shipped Klein scheduler's dynamic shifting
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, time_shift_type="exponential",
        base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15,
    )  # fmt: skip
    return Flux2KleinPipeline(
        scheduler=scheduler,
        vae=_tiny_flux2_vae(),
        text_encoder=_tiny_qwen3(len(tokenizer)),
        tokenizer=tokenizer,
        transformer=transformer,
        is_distilled=is_distilled,
    )
