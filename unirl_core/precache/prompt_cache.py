"""A content-addressed text-embedding cache for prompt files.

Prompt files never carry embeddings (the seed's rule); instead `unirl precache prompts FILE --recipe R` computes
each prompt's embeddings once per text encoder, stored under (encoder identity, prompt text):

    <cache root>/<encoder identity digest>/<sha256(prompt)[:2]>/<sha256(prompt)>.safetensors

RL rollouts read through it: a hit skips the text encoder, a miss computes (and, by default, writes back). The
identity digest covers the encoder class, its kwargs, its weights and the stored precision/padding, so a cache can
never serve embeddings of another encoder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from unirl_core.config.precache import EncodingSpec
from unirl_core.io import storage
from unirl_core.precache.encoders import build_encoder, encoder_identity, run_encoder


def prompt_digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


class PromptEmbeddingCache:
    """Embeddings of one text encoder, by prompt text. Thread-safe for readers; writes are atomic."""

    def __init__(self, root: str, identity: dict):
        self.identity = identity
        self.digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = f"{root.rstrip('/')}/{self.digest}"

    def path(self, prompt: str) -> str:
        digest = prompt_digest(prompt)
        return f"{self.folder}/{digest[:2]}/{digest}.safetensors"

    def get(self, prompt: str) -> dict[str, torch.Tensor] | None:
        path = self.path(prompt)
        return safetensors_load(storage.read_bytes(path)) if storage.exists(path) else None

    def put(self, prompt: str, tensors: dict[str, torch.Tensor]) -> None:
        if not storage.exists(f"{self.folder}/identity.json"):
            storage.write_bytes_atomic(
                f"{self.folder}/identity.json", json.dumps(self.identity, indent=1, sort_keys=True).encode()
            )
        data = safetensors_save(
            {k: v.contiguous() for k, v in tensors.items()}, metadata={"prompt_sha256": prompt_digest(prompt)}
        )
        storage.write_bytes_atomic(self.path(prompt), data)


class CachedTextEncoder:
    """A text encoder behind the cache: `embed(prompts)` returns one {name: tensor} per prompt."""

    def __init__(
        self, spec: EncodingSpec, cache_root: str, device: torch.device, dtype: torch.dtype, write_back: bool = True
    ):
        assert spec.modality == "text", "only text encodings are cached by prompt"
        self.spec, self.write_back = spec, write_back
        self.encoder = build_encoder(spec.encoder_config.model_dump(), device, dtype)
        identity = encoder_identity(spec.encoder_config.model_dump(), self.encoder)
        identity |= {"precision": spec.precision, "store_pad_tokens": spec.store_pad_tokens}
        self.cache = PromptEmbeddingCache(cache_root, identity)
        self.hits = self.misses = 0

    @torch.inference_mode()
    def embed(self, prompts: Sequence[str]) -> list[dict[str, torch.Tensor]]:
        found = [self.cache.get(p) for p in prompts]
        missing = [i for i, f in enumerate(found) if f is None]
        self.hits += len(prompts) - len(missing)
        self.misses += len(missing)
        if missing:
            for i, tensors in zip(missing, self._compute([prompts[i] for i in missing]), strict=True):
                found[i] = tensors
                if self.write_back:
                    self.cache.put(prompts[i], tensors)
        return found

    def _compute(self, prompts: list[str]) -> list[dict[str, torch.Tensor]]:
        output = run_encoder(self.encoder, prompts)
        hidden, mask = (output[0], output[1]) if isinstance(output, tuple | list) else (output, None)
        target = torch.float16 if self.spec.precision == 16 else torch.float32
        hidden = hidden.to("cpu", target)
        results = []
        for i in range(len(prompts)):
            if mask is not None and not self.spec.store_pad_tokens:
                results.append({"hidden": hidden[i][mask[i].bool().cpu()]})
            else:
                entry = {"hidden": hidden[i]}
                if mask is not None:
                    entry["mask"] = mask[i].to("cpu", torch.int64)
                results.append(entry)
        return results
