"""A tiny LLaVA judge, random weights, for the `vlm_judge` reward's tests and demos.

`write_tiny_vlm` writes the folder layout of a llava-hf checkpoint with a Qwen2 language model (as
llava-hf/llava-interleave-qwen-0.5b-hf: `LlavaForConditionalGeneration` weights and config, a `LlavaProcessor` with
a CLIP image processor and a Qwen2 tokenizer whose ChatML chat template places `<image>`), so `vlm_judge` loads it
with the same `AutoProcessor/AutoModelForImageTextToText.from_pretrained(folder)` calls, offline, and asks it
through the same chat-template path a real judge goes through.

Why LLaVA and not Qwen2.5-VL: transformers 5's Qwen2-VL processors cannot be built without torchvision (their video
processor needs it), which this project does not install; LLaVA's processor needs only PIL.

| part      | size                                                                                        |
|-----------|---------------------------------------------------------------------------------------------|
| vision    | CLIP ViT, 32 x 32 images, 8 x 8 patches (16 image tokens, CLS dropped), hidden 16, 2 layers |
| projector | 2-layer MLP, 16 -> 32 -> 32                                                                 |
| text      | Qwen2 decoder, hidden 32, 2 layers, 4 heads (2 kv)                                          |
| tokenizer | byte-level BPE: the 256 byte symbols, whole words yes/Yes/no/No, ChatML tokens and `<image>` |

Digits are single bytes, hence single tokens, as in Qwen's own tokenizer (which splits numbers into digits).
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_VLM_IMAGE_SIZE = 32
TINY_VLM_PATCH = 8
TINY_VLM_WORDS = ("yes", "Yes", "no", "No")  # whole words the judge answers with, single tokens
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>")


def chatml_template(parts: str) -> str:
    """A ChatML chat template with a default system turn; `parts`: the Jinja that writes a message's list content
    (its images and text)."""
    return (
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}" + parts + "{% endif %}<|im_end|>\n"
        "{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


# llava-interleave-qwen's ChatML template: images before a message's text.
CHAT_TEMPLATE = chatml_template(
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}<image>\n{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
)


def tiny_qwen_tokenizer(extra_special: tuple[str, ...] = ()):
    """A Qwen2Tokenizer on the 256 byte symbols plus merges that make each of TINY_VLM_WORDS one token; special
    tokens SPECIAL_TOKENS and `extra_special` (e.g. Qwen-VL's vision tokens), in that order."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    merges = []
    for word in TINY_VLM_WORDS:  # left to right: "y e" -> "ye", then "ye s" -> "yes"
        for end in range(2, len(word) + 1):
            pair = (word[: end - 1], word[end - 1])
            if pair not in merges:
                merges.append(pair)
                vocab[word[:end]] = len(vocab)
    specials = (*SPECIAL_TOKENS, *extra_special)
    for token in specials:
        vocab[token] = len(vocab)
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=list(specials[1:]),
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_vlm(seed: int = 0):
    """(LlavaForConditionalGeneration, LlavaProcessor) with weights drawn from `seed` (same seed, same weights)."""
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tokenizer = tiny_qwen_tokenizer()
    pad_id, eos_id, image_id = (tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>", "<image>"))
    config = LlavaConfig(
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=16,
            intermediate_size=24,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=TINY_VLM_IMAGE_SIZE,
            patch_size=TINY_VLM_PATCH,
            projection_dim=16,
            initializer_range=0.2,
        ),
        text_config=dict(
            model_type="qwen2",
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=pad_id,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            initializer_range=0.2,  # 10 x the default: answers that differ visibly between prompts and images
        ),
        image_token_index=image_id,
        image_seq_length=(TINY_VLM_IMAGE_SIZE // TINY_VLM_PATCH) ** 2,
        vision_feature_select_strategy="default",  # drop CLS: 16 image tokens
        vision_feature_layer=-2,
    )
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": TINY_VLM_IMAGE_SIZE},
        crop_size={"height": TINY_VLM_IMAGE_SIZE, "width": TINY_VLM_IMAGE_SIZE},
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=TINY_VLM_PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLS, dropped by the "default" strategy
        chat_template=CHAT_TEMPLATE,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    return model.eval(), processor


def write_tiny_vlm(folder: str | Path, seed: int = 0) -> Path:
    """Write a LLaVA folder (about 180 KB) that `AutoProcessor` and `AutoModelForImageTextToText`
    `.from_pretrained(folder)` load offline; same seed, same weights."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    model, processor = build_tiny_vlm(seed)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return out
