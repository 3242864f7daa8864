"""A tiny Qwen2.5-VL (and Qwen3-VL), random weights, for the autoregressive domain's VLM tests and the `demo_vlm`
recipe: `tiny:qwen2_5_vl` (`tiny:qwen3_vl`) in `train.model.path` builds it in the workspace once.

It is what makes the 3-D rotary positions (M-RoPE: temporal, height, width) tested on CPU: the folder has the layout
of a Qwen/Qwen2.5-VL-*-Instruct checkpoint (`Qwen2_5_VLForConditionalGeneration` weights and config, the Qwen2-VL
image processor's preprocessor_config.json, a Qwen2 tokenizer with the vision tokens and a chat template placing
`<|vision_start|><|image_pad|><|vision_end|>` before the text). No processor_config.json is written: building a
`Qwen2_5_VLProcessor` needs a video processor, hence torchvision, which this project does not install;
`domains.ar.processors.load_processor` assembles the processor from the image processor and the tokenizer then.

| part      | size                                                                                           |
|-----------|------------------------------------------------------------------------------------------------|
| vision    | ViT, 56 x 56 images (min = max pixels), 14 px patches, 2 x 2 merge: 16 patches, 4 image tokens  |
|           | (Qwen3-VL: 64 x 64 images, 16 px patches, DeepStack from block 0, interleaved M-RoPE)            |
| text      | Qwen2.5-VL decoder, hidden 64, 2 layers, 4 heads (2 kv) of 16, M-RoPE sections [2, 3, 3]      |
| tokenizer | byte-level BPE (`models.tiny_vlm.tiny_qwen_tokenizer`) plus the four Qwen-VL vision tokens       |
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_QWEN_VL_IMAGE_SIZE = 56
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


# Qwen2.5-VL-Instruct's chat template, cut to what the tiny model reads: the message's parts in order.
def chat_template() -> str:
    from unirl_core.models.tiny_vlm import chatml_template

    return chatml_template(
        "{% for content in message['content'] %}"
        "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
        "{% endfor %}"
    )


# arch -> (vision config, M-RoPE settings, image size): Qwen2.5-VL's windowed ViT of 14 px patches; Qwen3-VL's ViT of
# 16 px patches with learned position embeddings (4 x 4) and a DeepStack feature from its first block
ARCHS = {
    "qwen2_5_vl": (dict(patch_size=14, window_size=28, fullatt_block_indexes=[1]),
                   {"rope_theta": 1e6, "mrope_section": [2, 3, 3]}, 56),
    "qwen3_vl": (dict(patch_size=16, num_position_embeddings=16, deepstack_visual_indexes=[0]),
                 {"rope_theta": 5e6, "mrope_section": [2, 3, 3], "mrope_interleaved": True}, 64),
}  # fmt: skip


def build_tiny_qwen_vl(seed: int = 0, arch: str = "qwen2_5_vl"):
    """(the `arch` model, image processor, tokenizer), weights drawn from `seed`."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from unirl_core.models.tiny_vlm import tiny_qwen_tokenizer

    tokenizer = tiny_qwen_tokenizer(extra_special=VISION_TOKENS)
    tokenizer.chat_template = chat_template()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>", *VISION_TOKENS)}
    vision, rope, size = ARCHS[arch]
    name = {"qwen2_5_vl": "Qwen2_5_VL", "qwen3_vl": "Qwen3VL"}[arch]
    config = getattr(transformers, f"{name}Config")(
        vision_config=dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, spatial_merge_size=2,
                           temporal_patch_size=2, out_hidden_size=64, initializer_range=0.2, **vision),
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", **rope}, bos_token_id=ids["<|endoftext|>"],
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], initializer_range=0.1),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    image_processor = Qwen2VLImageProcessorPil(min_pixels=size**2, max_pixels=size**2, patch_size=vision["patch_size"],
                                               merge_size=2, temporal_patch_size=2)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, f"{name}ForConditionalGeneration")(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    return model.eval(), image_processor, tokenizer


def write_tiny_qwen_vl(folder: str | Path, seed: int = 0, arch: str = "qwen2_5_vl") -> Path:
    """Write the tiny Qwen2.5-VL folder (about 250 KB) that `AutoModelForImageTextToText.from_pretrained` and
    `domains.ar.processors.load_processor` load offline; same seed, same weights."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    model, image_processor, tokenizer = build_tiny_qwen_vl(seed, arch)
    model.save_pretrained(out, safe_serialization=True)
    image_processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
