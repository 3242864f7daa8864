"""Tiny Qwen-Image pipelines: the real classes (QwenImageTransformer2DModel, AutoencoderKLQwenImage,
Qwen2_5_VLForConditionalGeneration with its vision tower, Qwen2Tokenizer, Qwen2VLProcessor) with shrunk sizes and
random weights.

| piece        | tiny                                                   | real (Qwen/Qwen-Image)                        |
|--------------|--------------------------------------------------------|-----------------------------------------------|
| transformer  | 2 blocks, 2 heads x 16, rope axes (4, 6, 6), 16 in     | 60 blocks, 24 heads x 128, (16, 56, 56), 64 in |
| VAE          | base_dim 8, z_dim 4, one 2x downsample                 | base_dim 96, z_dim 16, 8x                     |
| text encoder | Qwen2.5-VL, 1 layer of width 32, vision depth 1        | Qwen2.5-VL-7B (3584 wide)                     |
| tokenizer    | byte-level BPE (every byte a token, no merges) + the   | Qwen2's 151k BPE                              |
|              | chat-template special tokens                           |                                               |
| processor    | (edit) Qwen2VL, images to at most 56 x 56 px           | Qwen2VLProcessor                              |

The byte-level vocabulary tokenizes any text without unknown tokens, so the prompt template is ~200 tokens here
(the real tokenizer: ~40); the pipelines drop the same fixed number of leading tokens either way. About 0.26 M
parameters (VAE 0.11 M, text encoder with its vision tower 0.05 M, transformer 0.09 M), 1.1 MB on disk.
"""

from __future__ import annotations

from transformers import Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

TEXT_HIDDEN = 32
LATENT_CHANNELS = 4
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip


def byte_level_qwen_tokenizer():
    """A Qwen2Tokenizer whose vocabulary is the 256 byte symbols (no merges) plus the template's special tokens."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], model_max_length=4096)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    return tokenizer


def _text_encoder(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": TEXT_HIDDEN, "intermediate_size": 48,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"),
            "pad_token_id": ids("<|endoftext|>"),
        },
        vision_config={
            "depth": 1, "hidden_size": 16, "intermediate_size": 24, "num_heads": 2, "patch_size": 14,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56, "out_hidden_size": TEXT_HIDDEN,
            "fullatt_block_indexes": [0],
        },
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
    )  # fmt: skip
    return Qwen2_5_VLForConditionalGeneration(config)


def _components():
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    tokenizer = byte_level_qwen_tokenizer()
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * LATENT_CHANNELS, out_channels=LATENT_CHANNELS, num_layers=2,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=TEXT_HIDDEN, axes_dims_rope=(4, 6, 6),
    )  # fmt: skip
    vae = AutoencoderKLQwenImage(
        base_dim=8, z_dim=LATENT_CHANNELS, dim_mult=[1, 2], num_res_blocks=1, temperal_downsample=[False],
        latents_mean=[-0.7571, -0.7089, -0.9113, 0.1075], latents_std=[2.8184, 1.4541, 2.3275, 2.6558],
    )  # fmt: skip
    # Qwen-Image's scheduler config (dynamic shift from the image sequence length, exponential time shift)
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.5, max_image_seq_len=8192, max_shift=0.9, shift=1.0,
        shift_terminal=0.02, time_shift_type="exponential", use_dynamic_shifting=True,
    )  # fmt: skip
    return {
        "transformer": transformer, "vae": vae, "scheduler": scheduler, "tokenizer": tokenizer,
        "text_encoder": _text_encoder(tokenizer),
    }  # fmt: skip


def build_qwen_image():
    """A complete tiny QwenImagePipeline."""
    from diffusers import QwenImagePipeline

    return QwenImagePipeline(**_components())


def build_qwen_image_edit():
    """A complete tiny QwenImageEditPipeline: the text encoder reads the condition image through a Qwen2VL
    processor whose image processor keeps images small (max_pixels 56 x 56: at most 4 vision tokens)."""
    import importlib.util

    from diffusers import QwenImageEditPipeline
    from transformers import Qwen2VLImageProcessor

    components = _components()
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56, patch_size=14, merge_size=2)
    if importlib.util.find_spec("torchvision") is None:
        processor = ImageOnlyQwen2VLProcessor(image_processor=image_processor, tokenizer=components["tokenizer"])
    else:
        processor = Qwen2VLProcessor(image_processor=image_processor, tokenizer=components["tokenizer"])
    return QwenImageEditPipeline(**components, processor=processor)


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """Qwen2VLProcessor without its video processor. transformers 5 cannot build (or load) a Qwen2VLProcessor
    without torchvision (its video processor needs it), so the tiny edit pipeline uses this subclass there; image +
    text inputs go through Qwen2VLProcessor's own code. diffusers records the class by its module path and finds it
    in `sys.modules`: import this module before loading such a folder."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)
