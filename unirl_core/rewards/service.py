"""The reward service: scores a rollout with a weighted composite of named rewards, and fails loudly.

A NaN, infinite or missing score stops the step with the sample ids: a trainer must never learn from it.
Components are returned separately (for per-component metrics and guard statistics) with the weighted total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

from unirl_core.rewards.functions import REWARDS


class RewardError(ValueError):
    """A reward that must not be trained on (non-finite or missing), naming the samples."""


class RewardService:
    """`weights`: reward name -> weight in the total; `guards`: names scored and reported, weight 0."""

    def __init__(self, weights: Mapping[str, float], guards: Sequence[str] = ()):
        unknown = sorted((set(weights) | set(guards)) - set(REWARDS))
        if unknown:
            raise ValueError(f"unknown reward(s) {unknown}; registered: {sorted(REWARDS)}")
        if not weights:
            raise ValueError("at least one weighted reward is needed")
        self.weights, self.guards = dict(weights), [g for g in guards if g not in weights]

    def score(
        self, images: Sequence[Image.Image], prompts: Sequence[str], sample_ids: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """{"total": [B], each component: [B]}; RewardError names the samples of any bad score."""
        components = {}
        for name in [*self.weights, *self.guards]:
            scores = np.asarray(REWARDS[name](images, prompts), dtype=np.float64)
            if scores.shape != (len(images),):
                raise RewardError(
                    f"reward {name} returned {scores.shape[0] if scores.ndim else 0} scores for {len(images)} samples"
                )
            bad = [sample_ids[i] for i in np.flatnonzero(~np.isfinite(scores))]
            if bad:
                raise RewardError(f"reward {name} is NaN or infinite for samples {bad}: refusing to train on it")
            components[name] = scores
        components["total"] = sum(self.weights[name] * components[name] for name in self.weights)
        return components
