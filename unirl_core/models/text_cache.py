"""The content-addressed text-embedding cache: a prompt's embeddings stored once per text encoder, under (encoder
identity, prompt text), so RL rollouts and repeated precaches skip running text encoders.

    <cache root>/<identity digest>/<sha256(prompt)[:2]>/<sha256(prompt)>.safetensors
    <cache root>/<identity digest>/identity.json

The identity (what the embeddings depend on: the family or encoder class, its settings, a fingerprint of its
weights, the stored precision) is chosen by the caller, so a cache can never serve another encoder's embeddings.
`PromptEmbeddingCache` reads and writes entries; `CachedConditioning` puts it in front of an encode function and
counts hits and misses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from unirl_core.io import storage

Conditioning = dict[str, torch.Tensor]


def prompt_digest(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()


class PromptEmbeddingCache:
    """Embeddings of one encoder identity, by prompt text. Thread-safe for readers; writes are atomic."""

    def __init__(self, root: str, identity: dict):
        self.identity = identity
        self.digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = f"{root.rstrip('/')}/{self.digest}"

    def path(self, prompt: str) -> str:
        digest = prompt_digest(prompt)
        return f"{self.folder}/{digest[:2]}/{digest}.safetensors"

    def get(self, prompt: str) -> Conditioning | None:
        path = self.path(prompt)
        return safetensors_load(storage.read_bytes(path)) if storage.exists(path) else None

    def put(self, prompt: str, tensors: Conditioning) -> None:
        if not storage.exists(f"{self.folder}/identity.json"):
            storage.write_bytes_atomic(
                f"{self.folder}/identity.json", json.dumps(self.identity, indent=1, sort_keys=True).encode()
            )
        data = safetensors_save(
            {k: v.contiguous() for k, v in tensors.items()}, metadata={"prompt_sha256": prompt_digest(prompt)}
        )
        storage.write_bytes_atomic(self.path(prompt), data)


class CachedConditioning:
    """Each distinct text's conditioning (unbatched CPU tensors) through an optional cache: `encode(texts)` computes
    a batch of misses ({name: [B, ...]}); with a `cache`, misses are written back and hits/misses counted."""

    def __init__(self, encode: Callable[[list[str]], Conditioning], cache: PromptEmbeddingCache | None = None):
        self.encode, self.cache = encode, cache
        self.hits = self.misses = 0

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> dict[str, Conditioning]:
        distinct = list(dict.fromkeys(texts))
        found = {t: self.cache.get(t) if self.cache else None for t in distinct}
        missing = [t for t, entry in found.items() if entry is None]
        if missing:
            computed = self.encode(missing)
            for i, text in enumerate(missing):
                found[text] = {k: v[i].detach().cpu().contiguous() for k, v in computed.items()}
                if self.cache:
                    self.cache.put(text, found[text])
        if self.cache:
            self.hits += len(distinct) - len(missing)
            self.misses += len(missing)
        return found
