"""`clip_score`: how well each image matches its prompt, by a local CLIP checkpoint loaded once per process.

The score is 100 x cosine(CLIP image embedding, CLIP text embedding), both the projected embeddings CLIP was
trained to align: the scale torchmetrics' CLIPScore reports, without its clamp at 0 (so a negative similarity
still ranks below a less negative one). Hessel et al.'s CLIP-S, 2.5 x max(cos, 0), is a rescaling of it.

CLIP is loaded with `from_pretrained(folder)` (offline: a folder, never a hub name), in eval mode, float32, and cached
per (resolved folder, device): `clip_score` and `aesthetic` on the same folder share one copy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image


@dataclass(frozen=True)
class LoadedClip:
    """A CLIPModel and its CLIPProcessor on one device; embeddings come back float32 and L2-normalized."""

    model: Any  # transformers.CLIPModel, eval mode
    processor: Any  # transformers.CLIPProcessor: .tokenizer and .image_processor
    device: torch.device

    @property
    def embed_dim(self) -> int:
        return self.model.config.projection_dim

    @torch.inference_mode()
    def embed_images(self, images: Sequence[Image.Image]) -> torch.Tensor:
        """[B, D] unit-norm image embeddings."""
        rgb = [image.convert("RGB") for image in images]
        pixels_BCHW = self.processor.image_processor(images=rgb, return_tensors="pt")["pixel_values"]
        pooled = self.model.vision_model(pixel_values=pixels_BCHW.to(self.device, self.model.dtype)).pooler_output
        return F.normalize(self.model.visual_projection(pooled).float(), dim=-1)

    @torch.inference_mode()
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        """[B, D] unit-norm text embeddings; texts longer than CLIP's context (77 tokens) are truncated."""
        # Padding to the full context makes a prompt's tokens independent of its batch-mates.
        tokens = self.processor.tokenizer(
            list(texts),
            padding="max_length",
            truncation=True,
            max_length=self.model.config.text_config.max_position_embeddings,
            return_tensors="pt",
        ).to(self.device)
        pooled = self.model.text_model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        return F.normalize(self.model.text_projection(pooled.pooler_output).float(), dim=-1)


def load_clip(
    path: str | Path, device: str | torch.device = "cpu", processor_path: str | Path | None = None
) -> LoadedClip:
    """The CLIP checkpoint in folder `path` on `device` (its processor from `processor_path`, default `path`),
    loaded on the first call and shared by later ones."""
    folder = Path(path).expanduser().resolve()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"CLIP model folder {str(path)!r} has no config.json: give a local folder written by "
            "CLIPModel.save_pretrained (with its tokenizer and image processor), e.g. a copy of "
            "openai/clip-vit-large-patch14; nothing is downloaded"
        )
    processor = Path(processor_path).expanduser().resolve() if processor_path else folder
    if not any((processor / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")):
        raise FileNotFoundError(
            f"CLIP processor folder {str(processor_path or path)!r} has no (pre)processor_config.json: give a folder "
            "written by CLIPProcessor.save_pretrained (tokenizer + image processor), e.g. a copy of "
            "laion/CLIP-ViT-H-14-laion2B-s32B-b79K; nothing is downloaded"
        )
    return _load_clip(str(folder), str(torch.device(device)), str(processor))


@functools.cache
def _load_clip(folder: str, device: str, processor_folder: str) -> LoadedClip:
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(folder, local_files_only=True, dtype=torch.float32)
    processor = CLIPProcessor.from_pretrained(processor_folder, local_files_only=True)
    return LoadedClip(model.to(device).eval().requires_grad_(False), processor, torch.device(device))


def in_batches(embed: Callable[[Sequence], torch.Tensor], items: Sequence, batch_size: int) -> torch.Tensor:
    """`embed` applied to consecutive slices of at most `batch_size` items, concatenated."""
    return torch.cat([embed(items[start : start + batch_size]) for start in range(0, len(items), batch_size)])


class ClipScore:
    """The `clip_score` reward: 100 x cosine(image, prompt) per sample (`scale`)."""

    def __init__(self, model_path: str | Path, device: str | torch.device = "cpu", batch_size: int = 32):
        self.clip = load_clip(model_path, device)
        self.batch_size = batch_size
        self.scale = 100.0

    def __call__(
        self, images: Sequence[Image.Image], prompts: Sequence[str], sample_ids: Sequence[str] = ()
    ) -> np.ndarray:
        if len(prompts) != len(images):
            raise ValueError(f"clip_score needs one prompt per image; got {len(prompts)} for {len(images)} images")
        if not images:
            return np.zeros(0)
        image_BD = in_batches(self.clip.embed_images, list(images), self.batch_size)
        text_BD = in_batches(self.clip.embed_texts, list(prompts), self.batch_size)
        return (self.scale * (image_BD * text_BD).sum(dim=-1)).cpu().double().numpy()


class PickScore(ClipScore):
    """The `pickscore` reward (yuvalkirstain/PickScore's README, flow_grpo's scorer before its / 26): the L2-normalized
    image and prompt embeddings of the PickScore model, their dot product times exp(logit_scale)."""

    def __init__(
        self,
        model_path: str | Path,
        processor_path: str | Path | None = None,
        device: str | torch.device = "cpu",
        batch_size: int = 16,
    ):
        self.clip = load_clip(model_path, device, processor_path)
        self.batch_size = batch_size
        self.scale = float(self.clip.model.logit_scale.exp())
