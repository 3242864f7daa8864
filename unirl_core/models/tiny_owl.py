"""A tiny OWLv2 open-vocabulary detector, random weights, for the `geneval` reward's tests and demos.

`write_tiny_owl` writes the folder layout google/owlv2-base-patch16-ensemble has (`Owlv2ForObjectDetection` weights
and config, a CLIP tokenizer, an `Owlv2ImageProcessor`), so `geneval` loads it with the same
`from_pretrained(folder)` calls, offline.

The tokenizer is a byte-level CLIP vocabulary (any text encodes without unknown tokens) laid out like the real one:
OWL pools each query at the *highest token id* (`input_ids.argmax`), which works because `<|endoftext|>` is the
last id, and it masks a query whose first id is 0; so the byte symbols come first (`!`, the pad token, is id 0, as
in OWL's tokenizer) and `<|startoftext|>`, `<|endoftext|>` last. (tiny.py's tokenizer puts them at 0 and 1: fine for
CLIP, which pools at the EOS id, but OWL would mask every query.)

| part     | size                                                                         |
|----------|------------------------------------------------------------------------------|
| vision   | ViT, 32 x 32 images (padded square), 8 x 8 patches: 16 boxes, hidden 32, 2 layers |
| text     | 514-token byte vocabulary, 32 positions, hidden 32, 2 layers, 4 heads         |
| heads    | box, class and objectness heads, redrawn at std fan_in**-0.5: boxes of varied size, scores 0.3-0.9 |
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_OWL_IMAGE_SIZE = 32
TINY_OWL_MAX_LENGTH = 32  # text positions: "a photo of a baseball glove" is 24 byte tokens with BOS and EOS
TINY_OWL_HIDDEN = 32


def byte_level_owl_tokenizer():
    """A CLIPTokenizer over the 256 byte symbols (plain and word-final), no merges, special tokens last, padding
    with "!" (id 0, OWL's pad token)."""
    from unirl_core.models.tiny import byte_level_clip_tokenizer

    return byte_level_clip_tokenizer(special_tokens_last=True, max_length=TINY_OWL_MAX_LENGTH)


def build_tiny_owl(seed: int = 0):
    """(Owlv2ForObjectDetection, Owlv2Processor) with weights drawn from `seed` (same seed, same weights)."""
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessor, Owlv2Processor

    tokenizer = byte_level_owl_tokenizer()
    common = dict(hidden_size=TINY_OWL_HIDDEN, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4)
    config = Owlv2Config(
        text_config=dict(
            common,
            vocab_size=len(tokenizer),
            max_position_embeddings=TINY_OWL_MAX_LENGTH,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=dict(common, image_size=TINY_OWL_IMAGE_SIZE, patch_size=8),
        projection_dim=TINY_OWL_HIDDEN,
    )
    image_processor = Owlv2ImageProcessor(size={"height": TINY_OWL_IMAGE_SIZE, "width": TINY_OWL_IMAGE_SIZE})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Owlv2ForObjectDetection(config)
        _rescale_heads(model)
    return model.eval(), Owlv2Processor(image_processor=image_processor, tokenizer=tokenizer)


@torch.no_grad()
def _rescale_heads(model) -> None:
    """Redraw the box, class and objectness heads' Linear weights with std fan_in**-0.5 (transformers draws them
    with std 1, which saturates every box to a line and every score to 0 or 1 in a random model)."""
    for head in (model.box_head, model.class_head, model.objectness_head):
        for layer in head.modules():
            if isinstance(layer, torch.nn.Linear):
                layer.weight.normal_(std=layer.in_features**-0.5)


def write_tiny_owl(folder: str | Path, seed: int = 0) -> Path:
    """Write an OWLv2 folder (about 300 KB) that `Owlv2ForObjectDetection/Owlv2Processor.from_pretrained(folder)`
    (and the Auto classes) load offline."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    model, processor = build_tiny_owl(seed)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return out
