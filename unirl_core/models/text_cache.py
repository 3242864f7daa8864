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

import contextlib
import hashlib
import json
import os
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


# --- text-encoder fingerprints: the weight files' content, hashed once per machine -----------------------------------

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf")


def _memo_path():
    from unirl_core.workspace import workspace

    return workspace().root / "cache" / "fingerprints.json"


def _read_memo(path) -> dict:
    """The memo {"<realpath>": {"size", "mtime_ns", "sha256"}}; a missing, unreadable or corrupt one is empty."""
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def hash_file(path: str) -> str:
    """sha256 of a file's bytes, read streamed (8 MiB at a time)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def files_fingerprint(folder: str) -> str | None:
    """A content-exact fingerprint of a model component folder (`<pipeline folder>/<component>/`): sha256 over every
    file's relative name and content hash (weights, their index, the config), or None when the folder holds no
    weight file (then the caller hashes the loaded weights). Each file's hash is memoized in the workspace
    (`cache/fingerprints.json`) under its real path, keyed by (size, mtime_ns): a machine reads a model version's
    weights once; a rewritten file (new size or mtime) is hashed again."""
    from pathlib import Path

    root = Path(folder)
    if not root.is_dir():
        return None
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    if not any(p.name.endswith(WEIGHT_SUFFIXES) for p in files):
        return None
    memo_path = _memo_path()
    memo, changed = _read_memo(memo_path), False
    digest = hashlib.sha256()
    for path in files:
        real, stat = os.path.realpath(path), path.stat()
        entry = memo.get(real)
        if not (
            isinstance(entry, dict)
            and entry.get("size") == stat.st_size
            and entry.get("mtime_ns") == stat.st_mtime_ns
            and isinstance(entry.get("sha256"), str)
        ):
            entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": hash_file(real)}
            memo[real], changed = entry, True
        digest.update(f"{path.relative_to(root).as_posix()}\0{entry['sha256']}\n".encode())
    if changed:
        with contextlib.suppress(OSError):  # a read-only workspace: correct, only slower next time
            memo = {**_read_memo(memo_path), **memo}  # keep what another process wrote meanwhile
            storage.write_bytes_atomic(str(memo_path), json.dumps(memo, indent=1, sort_keys=True).encode())
    return digest.hexdigest()


def state_dict_fingerprint(name: str, module: torch.nn.Module, digest) -> None:
    """Feed a loaded module's weights (every state_dict tensor's bytes, by key) into `digest`."""
    for key, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}.{key}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
