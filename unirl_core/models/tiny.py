"""Tiny models' shared parts: real diffusers/transformers architectures with random weights, built from config;
each family's tiny pipeline is built by `models/families/<family>/tiny.py` from these.

They exercise exactly the code real models go through (`save_pretrained`, then `from_pretrained(folder)`,
offline), in seconds on a CPU. Tokenizers are built in memory: a byte-level CLIP vocabulary (every byte is a
token, so any text encodes without unknown tokens) and ByT5's tokenizer (no files at all) for T5.
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


def clip_config(vocab_size: int, projection: bool):
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


def tiny_vae(scaling_factor: float, shift_factor: float | None = None):
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
