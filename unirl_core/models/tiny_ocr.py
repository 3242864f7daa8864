"""A tiny TrOCR-style OCR model, random weights, for the `ocr` reward's tests and demos.

`write_tiny_ocr` writes the folder layout microsoft/trocr-base-printed has (a `VisionEncoderDecoderModel`'s weights,
config and generation config, a `TrOCRProcessor`: image processor + tokenizer), so the `ocr` reward loads it with the
same `from_pretrained(folder)` calls, offline. The tokenizer is TrOCR's byte-level BPE (a RobertaTokenizer) cut down to
the 95 printable ASCII bytes and no merges: any text encodes (other characters become <unk>) and every reading the
random model makes decodes to printable text. Weights are drawn wider than the default init so that what the model
reads changes from image to image.

| part    | size                                                                                  |
|---------|---------------------------------------------------------------------------------------|
| encoder | ViT, 32 x 32 images, 8 x 8 patches, hidden 32, 1 layer, 4 heads                       |
| decoder | TrOCR, 100-token vocabulary, 64 positions, d_model 32, 1 layer, 4 heads               |
| ids     | <s> 0, <pad> 1, </s> 2 (also the decoder start token, as in TrOCR), <unk> 3, <mask> 4 |
"""

from __future__ import annotations

from pathlib import Path

import torch

TINY_OCR_IMAGE_SIZE = 32
INIT_STD = 0.5  # weights' init std; transformers' default 0.02 reads the same character for every image
TINY_OCR_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # TrOCR's ids: bos 0, pad 1, eos 2, unk 3


def byte_level_roberta_tokenizer():
    """A RobertaTokenizer (TrOCR's tokenizer class) whose vocabulary is TrOCR's special tokens and the byte-level
    symbols of the printable ASCII bytes (space to ~), with no merges."""
    from transformers import RobertaTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = bytes_to_unicode()
    tokens = [*TINY_OCR_SPECIAL_TOKENS, *(symbols[byte] for byte in range(32, 127))]
    return RobertaTokenizer(vocab={token: i for i, token in enumerate(tokens)}, merges=[])


def build_tiny_ocr(seed: int = 0):
    """(VisionEncoderDecoderModel, TrOCRProcessor) with weights drawn from `seed` (same seed, same weights)."""
    from transformers import (
        TrOCRConfig,
        TrOCRProcessor,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    tokenizer = byte_level_roberta_tokenizer()
    encoder = ViTConfig(
        image_size=TINY_OCR_IMAGE_SIZE,
        patch_size=8,
        hidden_size=32,
        intermediate_size=37,
        num_hidden_layers=1,
        num_attention_heads=4,
        initializer_range=INIT_STD,
    )
    ids = dict(bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    decoder = TrOCRConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        decoder_layers=1,
        decoder_attention_heads=4,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        cross_attention_hidden_size=encoder.hidden_size,
        init_std=INIT_STD,
        **ids,
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    for name, value in ids.items():
        setattr(config, name, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = VisionEncoderDecoderModel(config=config)
    model.generation_config.update(**ids)
    image_processor = ViTImageProcessor(
        size={"height": TINY_OCR_IMAGE_SIZE, "width": TINY_OCR_IMAGE_SIZE},
        image_mean=[0.5, 0.5, 0.5],  # TrOCR's normalization
        image_std=[0.5, 0.5, 0.5],
    )
    return model.eval(), TrOCRProcessor(image_processor=image_processor, tokenizer=tokenizer)


def write_tiny_ocr(folder: str | Path, seed: int = 0) -> Path:
    """Write an OCR folder (about 140 KB) that `VisionEncoderDecoderModel/AutoProcessor.from_pretrained(folder)`
    load offline."""
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    model, processor = build_tiny_ocr(seed)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return out
