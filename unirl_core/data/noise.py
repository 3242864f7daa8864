"""Random draws keyed by sample, so a run's numbers depend on (seed, step, sample id) only, never on how a batch is
split over ranks or micro-batches.

    sample_seed(seed, key)               -> a 63-bit seed from sha256("{seed}:{key}")
    sample_generators(seed, keys)        -> one torch.Generator per sample
    per_sample(generators, n, draw)      -> n samples' draws stacked on the first axis
    randn_like_samples(shape, gens)      -> standard normal [B, ...] float32, sample b from generator b
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import torch

Generators = torch.Generator | Sequence[torch.Generator]


def sample_seed(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:8], "little") & ((1 << 63) - 1)


def sample_generators(seed: int, keys: Sequence[str], device: torch.device | str = "cpu") -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(sample_seed(seed, key)) for key in keys]


def per_sample(generator: Generators, count: int, draw: Callable[[torch.Generator, int], torch.Tensor]) -> torch.Tensor:
    """`draw(generator, n)` -> n samples' draws (first axis). One generator: one call for the whole batch. One
    generator per sample: each sample's draws come from its own, so they do not depend on the batch it is in."""
    if isinstance(generator, torch.Generator):
        return draw(generator, count)
    if len(generator) != count:
        raise ValueError(f"{len(generator)} generators for a batch of {count}: give one per sample")
    return torch.cat([draw(one, 1) for one in generator])


def randn(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """Standard normal float32 draws on the generator's device (move them after)."""
    return torch.randn(tuple(shape), generator=generator, device=generator.device)


def randn_like_samples(shape: Sequence[int], generator: Generators) -> torch.Tensor:
    """Standard normal float32 [B, ...]: from one generator, or sample b from generator b."""
    return per_sample(generator, shape[0], lambda g, n: randn((n, *shape[1:]), g))
