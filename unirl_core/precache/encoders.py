"""Encoders for precaching, under NeMo's contract: built from `encoder_config` (`cls` + kwargs), eval mode, no
gradients; `encode(x)` (or `__call__(x)`) returns a tensor, or `(tensor, mask)` for text.

Built-ins load real pretrained folders or hub ids with `from_pretrained` (tiny folders in tests):

| class                 | input                      | output                                                           |
|-----------------------|----------------------------|------------------------------------------------------------------|
| AutoencoderKLEncoder  | images [B,3,H,W] in [-1,1] | latent distribution parameters [B,2C,h,w] (NeMo), or mean/sample |
| CLIPTextEncoder       | list of B strings          | (last hidden state [B,T,D], attention mask [B,T])                |
| T5TextEncoder         | list of B strings          | (last hidden state [B,T,D], attention mask [B,T])                |
| PipelinePromptEncoder | list of B strings          | a family adapter's conditioning, packed: [B,T,D] or [B,T+1,D]    |

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


def _resolve(pretrained: str) -> str:
    from unirl_core.models.adapters import resolve_model_path

    return resolve_model_path(pretrained)


class AutoencoderKLEncoder(torch.nn.Module):
    """A diffusers AutoencoderKL. `latent`: `parameters` (mean and log-variance concatenated on the channel axis,
    as NeMo stores them), `mean`, or `sample` (drawn with `seed`)."""

    def __init__(self, pretrained: str, subfolder: str | None = "vae", latent: str = "parameters", seed: int = 0):
        super().__init__()
        from diffusers import AutoencoderKL

        if latent not in ("parameters", "mean", "sample"):
            raise ValueError(f"latent={latent!r}: choose parameters, mean or sample")
        self.vae = AutoencoderKL.from_pretrained(_resolve(pretrained), subfolder=subfolder)
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

        pretrained = _resolve(pretrained)
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
    """The prompt conditioning of a model family, computed by that family's adapter (`encode_texts`) on the
    pipeline's own tokenizers and text encoders, so precached conditioning equals what RL rollouts compute.

    The precache writer stores one tensor per encoding, so the conditioning is packed into one [B, T', D]:

    | family | adapter conditioning                      | stored                                          |
    |--------|-------------------------------------------|-------------------------------------------------|
    | sd15   | embeds [B,T,D]                            | embeds [B,T,D]                                  |
    | sd3    | embeds [B,T,D], pooled [B,P] (P <= D)     | [B,T+1,D]: embeds, then pooled zero-padded to D |

    `unpack_prompt_encoding` undoes it. Keep `store_pad_tokens: true` (SD conditioning is padded to a fixed
    length) and `precision: 32` for conditioning equal to float32 rollouts.
    """

    def __init__(self, pretrained: str, family: str):
        super().__init__()
        import diffusers

        from unirl_core.models.adapters import FAMILIES

        if family not in PROMPT_FAMILIES:
            raise ValueError(f"family={family!r}: choose one of {', '.join(PROMPT_FAMILIES)}")
        skipped = {name: None for name in PROMPT_FAMILIES[family]}  # the denoiser and the VAE are not needed
        pipeline_class = getattr(diffusers, FAMILIES[family].pipeline_class)
        self.pipeline = pipeline_class.from_pretrained(_resolve(pretrained), **skipped)
        self.pipeline.set_progress_bar_config(disable=True)
        self.text_encoders = torch.nn.ModuleDict(
            {k: m for k, m in self.pipeline.components.items() if k.startswith("text_encoder") and m is not None}
        )  # registered, so `.to()`, eval mode and the identity fingerprint cover them (the pipeline shares them)
        self.adapter_class, self.family = FAMILIES[family], family

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def encode(self, texts: list[str]) -> torch.Tensor:
        # the adapter's own method on this text-only pipeline: it only reads `.pipeline` and `.device`
        cond = self.adapter_class.encode_texts(self, list(texts))
        if self.family == "sd15":
            return cond["embeds"]
        embeds, pooled = cond["embeds"], cond["pooled"]
        if pooled.shape[-1] > embeds.shape[-1]:
            raise ValueError(
                f"pooled width {pooled.shape[-1]} > embedding width {embeds.shape[-1]}: cannot pack into one row"
            )
        row = torch.nn.functional.pad(pooled, (0, embeds.shape[-1] - pooled.shape[-1]))
        return torch.cat([embeds, row[:, None, :].to(embeds.dtype)], dim=1)


PROMPT_FAMILIES = {"sd3": ("transformer", "vae"), "sd15": ("unet", "vae", "safety_checker", "feature_extractor")}


def pooled_width(pretrained: str) -> int:
    """SD3's pooled width P: the two CLIP projections, concatenated (read from the text encoders' configs)."""
    from transformers import AutoConfig

    path = _resolve(pretrained)
    return sum(AutoConfig.from_pretrained(path, subfolder=s).projection_dim for s in ("text_encoder", "text_encoder_2"))


def unpack_prompt_encoding(packed: torch.Tensor, family: str, pooled_dim: int | None = None) -> dict[str, torch.Tensor]:
    """A `PipelinePromptEncoder` encoding ([T',D] or [B,T',D]) -> the adapter's conditioning {"embeds"[, "pooled"]}.
    sd3 needs `pooled_dim` (`pooled_width(pretrained)`)."""
    if family == "sd15":
        return {"embeds": packed}
    assert family == "sd3" and pooled_dim is not None, (family, pooled_dim)
    return {"embeds": packed[..., :-1, :], "pooled": packed[..., -1, :pooled_dim]}


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
