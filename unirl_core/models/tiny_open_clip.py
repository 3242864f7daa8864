"""A tiny HPSv2-format model, random weights, for the `hpsv2` reward's tests and demos.

`write_tiny_open_clip` writes the three things the reward loads, offline:
- an open_clip model-config JSON, laid out as open_clip's ViT-H-14.json, tiny;
- a checkpoint in the published HPS file's format: torch.save of {"state_dict": open_clip's CLIP state dict}, the
  tensors float16 (read into the float32 model);
- a CLIP tokenizer folder whose vocabulary is the 256 byte symbols (plain and word-final), then <|startoftext|> and
  <|endoftext|>: any text encodes, and, as in CLIP's vocabulary, end-of-text has the highest id (open_clip finds it
  by argmax). It pads with "!" (id 0), as laion's CLIP tokenizers and open_clip do.

| part     | size                                                                     |
|----------|--------------------------------------------------------------------------|
| vision   | ViT, 32 x 32 images, 8 x 8 patches, width 32, 2 layers, 2 heads (head_width 16) |
| text     | 514-token byte vocabulary, 77 positions, width 32, 1 layer, 2 heads     |
| joint    | embed_dim 16                                                             |

A 150 KB checkpoint (65k parameters); CLIP's 49408-token vocabulary would make its token embedding alone 3 MB.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

import torch

from unirl_core.models.tiny import CLIP_MAX_LENGTH
from unirl_core.rewards.hpsv2 import open_clip_shapes

TINY_VOCAB = 2 * 256 + 2
TINY_ARCH = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": CLIP_MAX_LENGTH, "vocab_size": TINY_VOCAB, "width": 32, "heads": 2, "layers": 1},
}


class TinyOpenClip(NamedTuple):
    checkpoint: Path  # HPS_tiny.pt
    arch: Path  # tiny-open-clip.json
    tokenizer: Path  # a folder


def tiny_open_clip_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """open_clip CLIP state dict of TINY_ARCH, float32, drawn from `seed` (same seed, same weights; the global RNG
    is not touched)."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in open_clip_shapes(TINY_ARCH).items():
        noise = torch.randn(shape, generator=generator)
        if key == "logit_scale":
            state[key] = torch.tensor(math.log(1 / 0.07))  # open_clip's initial value
        elif "ln_" in key:  # LayerNorms: near the identity
            state[key] = (1.0 if key.endswith("weight") else 0.0) + 0.1 * noise
        elif key.endswith("bias"):
            state[key] = 0.02 * noise
        else:  # std 1/sqrt(fan in); open_clip stores its projections [in, out], every other matrix [out, in, ...]
            projection = key in ("visual.proj", "text_projection") or len(shape) == 1
            state[key] = noise * (shape[0] if projection else math.prod(shape[1:])) ** -0.5
    return state


def tiny_clip_bpe_tokenizer():
    """A CLIPTokenizer with no merges over the 512 byte symbols, the special tokens last (ids 512, 513) as in CLIP's
    vocabulary, padding with id 0 as open_clip does."""
    from unirl_core.models.tiny import byte_level_clip_tokenizer

    tokenizer = byte_level_clip_tokenizer(special_tokens_last=True)
    assert len(tokenizer) == TINY_VOCAB
    return tokenizer


def write_tiny_open_clip(folder: str | Path, seed: int = 0) -> TinyOpenClip:
    """Write the tiny checkpoint, arch JSON and tokenizer into the new or empty `folder`; their paths."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    out.mkdir(parents=True, exist_ok=True)
    paths = TinyOpenClip(out / "HPS_tiny.pt", out / "tiny-open-clip.json", out / "tokenizer")
    state = {key: value.half() for key, value in tiny_open_clip_state(seed).items()}
    torch.save({"state_dict": state}, paths.checkpoint)
    paths.arch.write_text(json.dumps(TINY_ARCH, indent=2) + "\n")
    tiny_clip_bpe_tokenizer().save_pretrained(paths.tokenizer)
    return paths
