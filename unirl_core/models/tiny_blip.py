"""A tiny ImageReward (BLIP ViT + BERT with cross-attention + head), random weights, for the `imagereward` tests.

`write_tiny_imagereward(folder)` writes what a user points `imagereward` at, at toy sizes (about 0.33 MB):

- `ImageReward.pt`: a state dict in the reference's key layout (blip.visual_encoder.*, blip.text_encoder.*,
  mlp.layers.*), plus the unused keys the published file carries (blip.vision_proj.*, blip.text_proj.*,
  blip.text_encoder.embeddings.position_ids);
- `arch.json`: the sizes below (`ImageRewardArch` fields), `imagereward`'s `arch`;
- `tokenizer/`: vocab.txt + tokenizer_config.json, a hand-written lowercase WordPiece vocabulary.

| part   | size                                                                                      |
|--------|-------------------------------------------------------------------------------------------|
| vision | ViT, 32 x 32 images, 8 x 8 patches, width 32, 2 layers, 4 heads                           |
| text   | BERT, 122-token vocabulary + [DEC] + [ENC], width 32, 2 layers, 4 heads, 40 positions     |
| head   | Linear 32 -> 24 -> 16 -> 8 -> 4 -> 1                                                      |

The vocabulary has BERT's special tokens, every lowercase letter and digit alone and as a `##` continuation, some
punctuation and a few words, so any ASCII prompt encodes (unknown characters become [UNK]).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch

from unirl_core.rewards.imagereward import ImageRewardArch

TINY_IMAGEREWARD_ARCH = dict(
    image_size=32,
    patch_size=8,
    vision_width=32,
    vision_layers=2,
    vision_heads=4,
    text_width=32,
    text_layers=2,
    text_heads=4,
    text_max_positions=40,  # >= the 35 prompt tokens
    head_widths=(24, 16, 8, 4),
)
_WORDS = ("the", "of", "on", "photo", "cat", "dog", "mat", "red", "blue", "square", "very", "long", "prompt")


def tiny_vocabulary() -> list[str]:
    """vocab.txt's lines: id = line number."""
    symbols = string.ascii_lowercase + string.digits
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return [*specials, *symbols, *string.punctuation, *(f"##{s}" for s in symbols), *_WORDS]


def tiny_reference_state(arch: ImageRewardArch, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors for every key of the reference's ImageReward module (same seed, same tensors).

    Linear and conv weights ~ N(0, 1/fan_in), LayerNorm weights ~ 1 + N(0, 0.1^2), everything else ~ N(0, 0.1^2):
    large enough that scores differ clearly between images and prompts."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in arch.reference_shapes().items():
        noise = torch.randn(shape, generator=generator)
        if key.endswith("weight") and len(shape) >= 2 and "embeddings." not in key:
            state[key] = noise * torch.tensor(shape[1:]).prod().item() ** -0.5
        elif key.endswith("weight") and len(shape) == 1:
            state[key] = 1 + 0.1 * noise
        else:
            state[key] = 0.1 * noise
    c, h = arch.vision_width, arch.text_width  # carried by the published file, unused by the score
    state |= {"blip.vision_proj.weight": torch.zeros(16, c), "blip.vision_proj.bias": torch.zeros(16)}
    state |= {"blip.text_proj.weight": torch.zeros(16, h), "blip.text_proj.bias": torch.zeros(16)}
    state["blip.text_encoder.embeddings.position_ids"] = torch.arange(arch.text_max_positions)[None]
    return state


def write_tiny_imagereward(folder: str | Path, seed: int = 0) -> Path:
    """Write ImageReward.pt, arch.json and tokenizer/ (see the module docstring) into the new folder `folder`."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    (out / "tokenizer").mkdir(parents=True)
    vocabulary = tiny_vocabulary()
    (out / "tokenizer" / "vocab.txt").write_text("\n".join(vocabulary) + "\n")
    (out / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    fields = dict(TINY_IMAGEREWARD_ARCH, text_vocab_size=len(vocabulary) + 2)  # + [DEC] and [ENC], as published
    (out / "arch.json").write_text(json.dumps(fields, indent=2))
    torch.save(tiny_reference_state(ImageRewardArch(**fields), seed), out / "ImageReward.pt")
    return out
