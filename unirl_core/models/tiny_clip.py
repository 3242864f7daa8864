"""A tiny CLIP and a tiny aesthetic head, random weights, for the model rewards' tests and demos.

`write_tiny_clip` writes the folder layout a real CLIP checkpoint has (`CLIPModel` weights and config, a tokenizer,
an image processor), so `clip_score` and `aesthetic` load it with the same `from_pretrained(folder)` calls, offline.
The tokenizer is tiny.py's byte-level CLIP vocabulary: any text encodes without unknown tokens.

| part     | size                                                                    |
|----------|-------------------------------------------------------------------------|
| vision   | ViT, 32 x 32 images, 8 x 8 patches, hidden 32, 2 layers, 4 heads       |
| text     | 514-token byte vocabulary, 77 positions, hidden 32, 2 layers, 4 heads  |
| joint    | projection_dim 32 (the embedding `clip_score` compares, `aesthetic` scores) |
"""

from __future__ import annotations

from pathlib import Path

import torch

from unirl_core.models.tiny import CLIP_HIDDEN, CLIP_MAX_LENGTH, byte_level_clip_tokenizer

TINY_CLIP_IMAGE_SIZE = 32
TINY_CLIP_EMBED_DIM = CLIP_HIDDEN  # projection_dim: the input width of an aesthetic head for this CLIP
TINY_HEAD_WIDTHS = (32, 16, 8, 4)  # the public LAION head's are (1024, 128, 64, 16)


def build_tiny_clip(seed: int = 0):
    """(CLIPModel, CLIPProcessor) with weights drawn from `seed` (same seed, same weights)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    tokenizer = byte_level_clip_tokenizer()
    common = dict(hidden_size=CLIP_HIDDEN, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4)
    config = CLIPConfig(
        text_config=dict(
            common,
            vocab_size=len(tokenizer),
            max_position_embeddings=CLIP_MAX_LENGTH,
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
        ),
        vision_config=dict(common, image_size=TINY_CLIP_IMAGE_SIZE, patch_size=8),
        projection_dim=TINY_CLIP_EMBED_DIM,
    )
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": TINY_CLIP_IMAGE_SIZE},
        crop_size={"height": TINY_CLIP_IMAGE_SIZE, "width": TINY_CLIP_IMAGE_SIZE},
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(config)
    return model.eval(), CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)


def write_tiny_clip(folder: str | Path, seed: int = 0) -> Path:
    """Write a CLIP folder (about 200 KB) that `CLIPModel/CLIPProcessor.from_pretrained(folder)` load offline."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    model, processor = build_tiny_clip(seed)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return out


def write_tiny_aesthetic_head(path: str | Path, embed_dim: int = TINY_CLIP_EMBED_DIM, seed: int = 0) -> Path:
    """Write a `.safetensors` aesthetic head with the public LAION head's layer names, on `embed_dim` inputs.

    Keys `layers.{0,2,4,6,7}.{weight,bias}`: Linear embed_dim->32->16->8->4->1 (the odd indices the LAION head
    gives its dropouts are skipped, as there). See unirl_core/rewards/aesthetic.py for the format.
    """
    from safetensors.torch import save_file

    widths = (embed_dim, *TINY_HEAD_WIDTHS, 1)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for index, fan_in, fan_out in zip((0, 2, 4, 6, 7), widths[:-1], widths[1:], strict=True):
        bound = fan_in**-0.5  # nn.Linear's default init range
        tensors[f"layers.{index}.weight"] = (torch.rand(fan_out, fan_in, generator=generator) * 2 - 1) * bound
        tensors[f"layers.{index}.bias"] = (torch.rand(fan_out, generator=generator) * 2 - 1) * bound
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out))
    return out
