"""Precache encoders behind the text-embedding cache (`unirl_core.models.text_cache`) for prompt files.

Prompt files never carry embeddings (the seed's rule); instead `unirl precache prompts FILE --recipe R` computes
each prompt's embeddings once per text encoder, stored under (encoder identity, prompt text):

    <cache root>/<encoder identity digest>/<sha256(prompt)[:2]>/<sha256(prompt)>.safetensors

RL rollouts read through it: a hit skips the text encoder, a miss computes (and, by default, writes back). The
identity digest covers the encoder class, its kwargs, its weights and the stored precision/padding, so a cache can
never serve embeddings of another encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from unirl_core.config.precache import EncodingSpec
from unirl_core.models.text_cache import PromptEmbeddingCache, prompt_digest
from unirl_core.precache.encoders import build_encoder, encoder_identity, run_encoder


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


__all__ = ["CachedTextEncoder", "PromptEmbeddingCache", "prompt_digest"]


@dataclass(frozen=True)
class CacheFill:
    """What filling one cache did: `label` names the encoding or the model, `texts` distinct texts seen."""

    label: str
    texts: int
    hits: int
    misses: int
    folder: str


def fill_prompt_caches(
    precache, train, prompts: list[str], root: str, model_root: str, batch_size: int = 32
) -> list[CacheFill]:
    """Fill the text-embedding caches for `prompts`: under `root`, each text encoding of the `precache` section
    (its own batch size, device and dtype); under `model_root`, the `train` section's model conditioning (what
    `train.model.text_embedding_cache` reads, the negative prompt included). Either section may be None."""
    fills = []
    for spec in [e for e in precache.encodings if e.modality == "text"] if precache else []:
        from unirl_core.models.dtypes import DTYPES
        from unirl_core.precache.run import resolve_device

        cached = CachedTextEncoder(spec, root, resolve_device(precache.device), DTYPES[precache.dtype])
        for start in range(0, len(prompts), precache.batch_size_per_GPU):
            cached.embed(prompts[start : start + precache.batch_size_per_GPU])
        fills.append(CacheFill(spec.key, len(prompts), cached.hits, cached.misses, cached.cache.folder))
    if train is not None:
        from unirl_core.models.registry import build_family

        family = build_family(
            train.model.model_copy(update={"lora": None, "text_embedding_cache": model_root}), train.sampling
        )
        texts = list(dict.fromkeys([*prompts, train.sampling.negative_prompt]))
        for start in range(0, len(texts), batch_size):
            family.texts(texts[start : start + batch_size])
        label = f"train.model ({train.model.family})"
        fills.append(CacheFill(label, len(texts), family.texts.hits, family.texts.misses, family.texts.cache.folder))
    return fills
