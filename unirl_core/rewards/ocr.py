"""`ocr`: how exactly each image renders the text its prompt quotes (Flow-GRPO's OCR reward), read by a local OCR model.

The reward is flow_grpo's `OcrScorer` (flow_grpo/ocr.py; read at zhtmike/flow_grpo@def7b84, a verbatim fork of
yifan123/flow_grpo), per sample:

    target   = prompt.split('"')[1]          the text after the prompt's first double quote, up to the next one
    t, r     = target, recognized text       each with spaces (" " only) removed, then lowercased
    reward   = 1                                      if t is a substring of r
             = 1 - min(Levenshtein(r, t), |t|) / |t|  otherwise

so it lies in [0, 1]: 1 when the quoted text is there (extra text read around it costs nothing), 0 when nothing is
read or the reading is at least |t| edits away. Where flow_grpo crashes we refuse with a ValueError naming the
prompt, before any image is read: a prompt without a double quote (flow_grpo: IndexError) and a quoted text that is
empty once spaces are removed (flow_grpo: ZeroDivisionError). A prompt with a single `"` quotes everything after it.

What differs from flow_grpo is the reader. flow_grpo runs PaddleOCR (text detection, then recognition of each line,
the lines of positive confidence concatenated). We read with a transformers `VisionEncoderDecoderModel` in the TrOCR
layout (ViT/DeiT encoder + TrOCR decoder), greedy (one beam, no sampling), `max_new_tokens` per image, with its own
processor. TrOCR recognizes one text line and has no detector: the whole image is resized to its input (384 x 384
for microsoft/trocr-base-printed), which reads large, centered text best. Errors propagate (flow_grpo scores an OCR
exception 0 and prints it).

The model is loaded with `from_pretrained(folder)` (offline: a folder, never a hub name), in eval mode, float32, and
cached per (resolved folder, device).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from unirl_core.rewards.errors import RewardError

ENCODER_DECODER_TYPE = "vision-encoder-decoder"  # config.json's model_type for a VisionEncoderDecoderModel


def target_text(prompt: str) -> str:
    """The text `prompt` asks to render: what lies between its first two double quotes (flow_grpo's
    `prompt.split('"')[1]`). ValueError when there is none to score against."""
    if '"' not in prompt:
        raise ValueError(
            f'ocr scores the text a prompt quotes in double quotes, e.g. a sign that says "Open"; got {prompt!r}'
        )
    target = prompt.split('"')[1]
    if not target.replace(" ", ""):
        raise ValueError(f"ocr needs a non-empty quoted text to compare the image with; got {prompt!r}")
    return target


def ocr_reward(recognized: str, prompt: str) -> float:
    """flow_grpo's OCR reward in [0, 1] for `recognized` text against the text `prompt` quotes (module docstring)."""
    target = target_text(prompt).replace(" ", "").lower()
    read = recognized.replace(" ", "").lower()
    if target in read:
        return 1.0
    from rapidfuzz.distance import Levenshtein  # here: a GPU node without rapidfuzz imports this module fine

    return 1.0 - min(Levenshtein.distance(read, target), len(target)) / len(target)


@dataclass(frozen=True)
class LoadedOcr:
    """A VisionEncoderDecoderModel and its processor on one device."""

    model: Any  # transformers.VisionEncoderDecoderModel, eval mode
    processor: Any  # e.g. transformers.TrOCRProcessor: image processor + tokenizer
    device: torch.device

    @torch.inference_mode()
    def read(self, images: Sequence[Image.Image], max_new_tokens: int) -> list[str]:
        """The text read in each image: greedy decoding of at most `max_new_tokens` tokens, special tokens dropped."""
        rgb = [image.convert("RGB") for image in images]
        pixels_BCHW = self.processor(images=rgb, return_tensors="pt")["pixel_values"]
        tokens_BT = self.model.generate(
            pixel_values=pixels_BCHW.to(self.device, self.model.dtype),
            num_beams=1,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            use_cache=True,  # TrOCR's generation_config turns the cache off; same tokens, faster
        )
        return self.processor.batch_decode(tokens_BT, skip_special_tokens=True)


def load_ocr(path: str | Path, device: str | torch.device = "cpu") -> LoadedOcr:
    """The OCR model in folder `path` on `device`, loaded on the first call and shared by later ones."""
    folder = Path(path).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"OCR model folder {str(path)!r} has no config.json: give a local folder written by "
            "VisionEncoderDecoderModel.save_pretrained with its processor (tokenizer + image processor), e.g. a "
            "copy of microsoft/trocr-base-printed; nothing is downloaded"
        )
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if model_type != ENCODER_DECODER_TYPE:
        raise ValueError(
            f"OCR model folder {str(path)!r} holds model_type {model_type!r}; ocr reads with a "
            f"VisionEncoderDecoderModel (model_type {ENCODER_DECODER_TYPE!r}), e.g. a copy of "
            "microsoft/trocr-base-printed"
        )
    if not any((folder / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")):
        raise FileNotFoundError(
            f"OCR model folder {str(path)!r} has no (pre)processor_config.json: save the model's processor there "
            "too (TrOCRProcessor.save_pretrained: tokenizer + image processor); nothing is downloaded"
        )
    return _load_ocr(str(folder), str(torch.device(device)))


@functools.cache
def _load_ocr(folder: str, device: str) -> LoadedOcr:
    from transformers import AutoProcessor, VisionEncoderDecoderModel

    model = VisionEncoderDecoderModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    return LoadedOcr(model.to(device).eval().requires_grad_(False), processor, torch.device(device))


class OcrScore:
    """The `ocr` reward: flow_grpo's text-accuracy reward in [0, 1] per sample; `last_texts` holds what was read."""

    def __init__(
        self,
        model_path: str | Path,
        device: str | torch.device = "cpu",
        batch_size: int = 16,
        max_new_tokens: int = 32,
    ):
        self.ocr = load_ocr(model_path, device)
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.last_texts: list[str] = []

    def recognize(self, images: Sequence[Image.Image]) -> list[str]:
        """The text read in each image, `batch_size` images per generate call."""
        images = list(images)
        return [
            text
            for start in range(0, len(images), self.batch_size)
            for text in self.ocr.read(images[start : start + self.batch_size], self.max_new_tokens)
        ]

    def __call__(
        self, images: Sequence[Image.Image], prompts: Sequence[str], sample_ids: Sequence[str] = ()
    ) -> np.ndarray:
        if len(prompts) != len(images):
            raise ValueError(f"ocr needs one prompt per image; got {len(prompts)} for {len(images)} images")
        ids = list(sample_ids) or [str(i) for i in range(len(prompts))]
        for sample_id, prompt in zip(ids, prompts, strict=True):  # refuse before reading any image
            try:
                target_text(prompt)
            except ValueError as exc:
                raise RewardError(f"reward ocr cannot score sample {sample_id}: {exc}") from None
        self.last_texts = self.recognize(images)
        rewards = [ocr_reward(text, prompt) for text, prompt in zip(self.last_texts, prompts, strict=True)]
        return np.array(rewards, dtype=np.float64)
