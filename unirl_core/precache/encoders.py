"""Encoders for precaching, under NeMo's contract: built from `encoder_config` (`cls` + kwargs), eval mode, no
gradients; `encode(x)` (or `__call__(x)`) returns a tensor, or `(tensor, mask)` for text.

Built-ins load real pretrained folders or hub ids with `from_pretrained` (tiny folders in tests):

| class                 | input                      | output                                                           |
|-----------------------|----------------------------|------------------------------------------------------------------|
| AutoencoderKLEncoder  | images [B,3,H,W] in [-1,1] | latent distribution parameters [B,2C,h,w] (NeMo), or mean/sample |
| CLIPTextEncoder       | list of B strings          | (last hidden state [B,T,D], attention mask [B,T])                |
| T5TextEncoder         | list of B strings          | (last hidden state [B,T,D], attention mask [B,T])                |
| PipelinePromptEncoder | list of B strings          | a model family's conditioning, packed: [B,T,D] or [B,T+1,D]      |
| PipelineImageEncoder  | images [B,3,H,W] in [-1,1] | a model family's scaled latents [B,C,h,w] (its VAE, its scaling) |

`pretrained` may also be `tiny:<family>` (the test models, see `unirl_core.models.tiny`).
`encoder_identity` fingerprints the class, its kwargs and its weights: a cache built with other weights is refused.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
from typing import Any

import torch

from unirl_core.models.registry import resolve_model_path


class AutoencoderKLEncoder(torch.nn.Module):
    """A diffusers AutoencoderKL. `latent`: `parameters` (mean and log-variance concatenated on the channel axis,
    as NeMo stores them), `mean`, or `sample` (drawn with `seed`)."""

    def __init__(self, pretrained: str, subfolder: str | None = "vae", latent: str = "parameters", seed: int = 0):
        super().__init__()
        from diffusers import AutoencoderKL

        if latent not in ("parameters", "mean", "sample"):
            raise ValueError(f"latent={latent!r}: choose parameters, mean or sample")
        self.vae = AutoencoderKL.from_pretrained(resolve_model_path(pretrained), subfolder=subfolder)
        self.latent, self.seed = latent, seed

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        distribution = self.vae.encode(images.to(self.vae.dtype)).latent_dist
        if self.latent == "parameters":
            return distribution.parameters
        if self.latent == "mean":
            return distribution.mean
        generator = torch.Generator(device=images.device).manual_seed(self.seed)
        return distribution.sample(generator=generator)


class _HFTextEncoder(torch.nn.Module):
    model_class = ""

    def __init__(
        self,
        pretrained: str,
        subfolder: str | None = "text_encoder",
        tokenizer_subfolder: str | None = "tokenizer",
        max_length: int = 77,
    ):
        super().__init__()
        import transformers

        pretrained = resolve_model_path(pretrained)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(pretrained, subfolder=tokenizer_subfolder)
        model_class = getattr(transformers, self.model_class)
        self.model = model_class.from_pretrained(pretrained, subfolder=subfolder)
        self.max_length = max_length

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.tokenizer(
            list(texts), padding="max_length", max_length=self.max_length, truncation=True, return_tensors="pt"
        )
        device = next(self.model.parameters()).device
        mask = tokens.attention_mask.to(device)
        hidden = self.model(input_ids=tokens.input_ids.to(device), attention_mask=mask).last_hidden_state
        return hidden, mask


class CLIPTextEncoder(_HFTextEncoder):
    """CLIP's text transformer (with or without projection): the last hidden state and the attention mask."""

    model_class = "CLIPTextModel"


class T5TextEncoder(_HFTextEncoder):
    """A T5 encoder: the last hidden state and the attention mask."""

    model_class = "T5EncoderModel"

    def __init__(self, pretrained: str, subfolder: str | None = "text_encoder_3", tokenizer_subfolder: str | None = "tokenizer_3", max_length: int = 256):  # fmt: skip
        super().__init__(pretrained, subfolder, tokenizer_subfolder, max_length)


class PipelinePromptEncoder(torch.nn.Module):
    """The prompt conditioning of a model family, computed by that family (`encode_texts`) on the pipeline's own
    tokenizers and text encoders (loaded without the denoiser and the VAE), so precached conditioning equals what RL
    rollouts compute. The precache writer stores one tensor per encoding, so the conditioning is packed into one
    [B, T', D] by the family (`pack_conditioning`; sd15: the embeds, sd3: the embeds then the pooled row padded to
    D) and unpacked by `Family.unpack_conditioning`. Keep `store_pad_tokens: true` (SD conditioning is padded to a
    fixed length) and `precision: 32` for conditioning equal to float32 rollouts.
    """

    def __init__(self, pretrained: str, family: str):
        super().__init__()
        from unirl_core.models.registry import family_class

        self.family = family_class(family)(resolve_model_path(pretrained), text_only=True)
        self.text_encoders = torch.nn.ModuleDict(
            {k: m for k, m in self.family.pipeline.components.items() if k.startswith("text_encoder") and m is not None}
        )  # registered, so `.to()`, eval mode and the identity fingerprint cover them (the pipeline shares them)

    def encode(self, texts: list[str]) -> torch.Tensor:
        self.family.device = next(self.parameters()).device  # moved by `.to()` after loading
        return self.family.pack_conditioning(self.family.encode_texts(list(texts)))


class PipelineImageEncoder(torch.nn.Module):
    """The image latents of a model family, computed by that family (`encode_pixels`: its VAE and its latent
    normalization: scaling/shift, per-channel statistics, patchifying) on the pipeline's VAE loaded alone, so
    precached latents are what the family's rollouts and warm-up use, for every family (AutoencoderKLEncoder
    covers AutoencoderKL only and stores the unscaled distribution)."""

    def __init__(self, pretrained: str, family: str):
        super().__init__()
        from unirl_core.models.registry import family_class

        self.family = family_class(family)(resolve_model_path(pretrained), vae_only=True)
        self.vae = self.family.pipeline.vae  # registered, so `.to()` and the identity fingerprint cover it

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        self.family.device = next(self.parameters()).device  # moved by `.to()` after loading
        return self.family.encode_pixels(images)


_BUILD_LOCK = threading.Lock()  # from_pretrained patches torch globals while loading (meta-device init): one at a time


def build_encoder(encoder_config: dict[str, Any], device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """NeMo's rule: `cls` is a dotted class path, the other keys its kwargs; eval mode, gradients off."""
    kwargs = dict(encoder_config)
    path = kwargs.pop("cls")
    module_name, _, class_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"encoder_config.cls={path!r} cannot be imported ({exc})") from None
    with _BUILD_LOCK:
        encoder = cls(**kwargs)
    if isinstance(encoder, torch.nn.Module):
        encoder = encoder.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return encoder


def run_encoder(encoder, inputs):
    """`encode(x)` if the encoder has it, else `encoder(x)` (NeMo's contract)."""
    return encoder.encode(inputs) if hasattr(encoder, "encode") else encoder(inputs)


def encoder_identity(encoder_config: dict[str, Any], encoder) -> dict[str, Any]:
    """What the cache was built with: class, kwargs, and a fingerprint of every weight."""
    digest = hashlib.sha256()
    if isinstance(encoder, torch.nn.Module):
        for name, tensor in sorted(encoder.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    kwargs = {k: v for k, v in encoder_config.items() if k != "cls"}
    return {
        "cls": encoder_config["cls"],
        "kwargs": json.loads(json.dumps(kwargs, default=str)),
        "weights": digest.hexdigest()[:16],
    }
