"""The text-conditioning part of a family: prompts -> the denoiser's conditioning, through an in-memory table and the
optional text-embedding cache, with the negative prompt's half when CFG is on; the precache form (`pack_conditioning`,
one tensor per prompt) and its inverse. A family mixes in `TextConditioning` (conditioning `{"embeds"}`) or, before
it, `PooledConditioning` (`{"embeds", "pooled"}`: SD3, SDXL, FLUX.1) and implements `encode_texts`.

Reads from the family: `pipeline` (its `text_encoder*` components), `path`, `device`, `dtype`, `name`,
`negative_prompt`, `cfg` (the guidance part) and `texts` (set when the family loads).
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from pathlib import Path

import torch

from unirl_core.models.text_cache import (
    CachedConditioning,
    Conditioning,
    PromptEmbeddingCache,
    files_fingerprint,
    state_dict_fingerprint,
)

TEXT_ENCODER_PREFIX = "text_encoder"  # pipeline components named so are the text encoders (the VLM of edit models too)


def text_encoder_placement(setting: str, device: str, text_cache: bool, text_only_conditioning: bool = True) -> str:
    """Where the frozen text encoders live: "device" (with the model) or "cpu". `setting` is the recipe's
    `train.model.text_encoders`; "auto" is "cpu" when a text-embedding cache serves the prompts (`text_cache`), the
    family's prompts can be cached (`text_only_conditioning`: an edit model's VLM reads every condition image at
    every rollout, so it stays on the device) and the device is not the CPU already; otherwise "device"."""
    if setting not in ("auto", "device", "cpu"):
        raise ValueError(f"text_encoders {setting!r}: choose auto, device or cpu")
    if setting != "auto":
        return setting
    on_cpu = torch.device(device).type == "cpu"
    return "cpu" if text_cache and text_only_conditioning and not on_cpu else "device"


class TextConditioning(ABC):
    """Prompts -> conditioning {name: [B, ...]} (see the module)."""

    @abstractmethod
    def encode_texts(self, texts: list[str]) -> Conditioning:
        """Conditioning of a batch of texts without CFG: {name: [B, ...]}."""

    def text_encoder_modules(self) -> dict[str, torch.nn.Module]:
        """The loaded text encoders by component name (those named `text_encoder*`)."""
        return {
            name: module
            for name, module in sorted(self.pipeline.components.items())
            if name.startswith(TEXT_ENCODER_PREFIX) and isinstance(module, torch.nn.Module)
        }

    @property
    def text_device(self) -> torch.device:
        """Where the text encoders are (their inputs go there): `device`, or the CPU with `text_encoders: cpu`.
        Read from the weights, so a caller that moves the modules (precache's `PipelinePromptEncoder`) is followed."""
        for module in self.text_encoder_modules().values():
            for parameter in module.parameters():
                return parameter.device
        return self.device

    def text_identity(self) -> dict:
        """What the conditioning depends on (the text-embedding cache key): the family, a fingerprint of every
        text encoder's weights, the dtype. The fingerprint hashes each text encoder's files in the pipeline folder
        (`<path>/<component>/`, memoized per machine by `files_fingerprint`: a model version is read once), or the
        loaded weights where there are no files (a hub id, a pipeline built in memory)."""
        digest = hashlib.sha256()
        for name, module in self.text_encoder_modules().items():
            files = files_fingerprint(str(Path(self.path) / name)) if getattr(self, "path", None) else None
            if files is not None:
                digest.update(f"{name}:files:{files}".encode())
            else:
                state_dict_fingerprint(name, module, digest)
        return {"family": self.name, "text_encoders": digest.hexdigest()[:16], "dtype": str(self.dtype)}

    def attach_text_cache(self, root: str) -> None:
        """Read prompt conditioning through the text-embedding cache at `root` (misses are computed and written)."""
        self.texts = CachedConditioning(self.encode_texts, PromptEmbeddingCache(root, self.text_identity()))

    def encode(self, prompts: list[str]) -> Conditioning:
        """Conditioning of a batch (with the negative prompt's first, as [negative, positive], when CFG is on).
        Each distinct text is encoded once."""
        texts = [*prompts, self.negative_prompt] if self.cfg else list(prompts)
        table = self.texts(texts)
        positive = {k: torch.stack([table[p][k] for p in prompts]) for k in table[prompts[0]]}
        if self.cfg:
            negative = table[self.negative_prompt]
            positive = {k: torch.cat([negative[k].expand_as(v), v]) for k, v in positive.items()}
        return {k: v.to(self.device) for k, v in positive.items()}

    def pack_conditioning(self, cond: Conditioning) -> torch.Tensor:
        """The precache form: one tensor [B, T, D] per batch (the precache writer stores one per encoding).
        Default: a family whose conditioning is `embeds` alone."""
        (tensor,) = cond.values()
        return tensor

    @classmethod
    def unpack_conditioning(cls, packed: torch.Tensor, path: str) -> Conditioning:
        """`pack_conditioning`'s inverse ([T, D] or [B, T, D]); `path`: the (resolved) pipeline folder."""
        return {"embeds": packed}


class PooledConditioning(TextConditioning):
    """Conditioning {"embeds": [B, T, D], "pooled": [B, P]} (SD3, SDXL, FLUX.1), stored by precache as one
    [B, T+1, D]: the embeds, then the pooled row zero-padded to D (P <= D). A family mixes it in before `Family`
    and says where P comes from: `pooled_width(path)`, read from the pipeline folder's text-encoder configs."""

    @staticmethod
    def pooled_width(path: str) -> int:
        raise NotImplementedError

    def pack_conditioning(self, cond: Conditioning) -> torch.Tensor:
        embeds, pooled = cond["embeds"], cond["pooled"]
        if pooled.shape[-1] > embeds.shape[-1]:
            raise ValueError(
                f"pooled width {pooled.shape[-1]} > embedding width {embeds.shape[-1]}: cannot pack into one row"
            )
        row = torch.nn.functional.pad(pooled, (0, embeds.shape[-1] - pooled.shape[-1]))
        return torch.cat([embeds, row[:, None, :].to(embeds.dtype)], dim=1)

    @classmethod
    def unpack_conditioning(cls, packed: torch.Tensor, path: str) -> Conditioning:
        return {"embeds": packed[..., :-1, :], "pooled": packed[..., -1, : cls.pooled_width(path)]}
