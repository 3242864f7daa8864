"""The numbers `unirl eval` prints: a mean with its bootstrap 95 % interval, alone or as the paired difference of two
models scored on the same prompts and noise.

The interval is scipy's percentile bootstrap (`scipy.stats.bootstrap`, 9,999 resamples, a fixed seed, so a re-run
prints the same table). A paired difference resamples the per-prompt differences (the prompts, not the two models
apart): what is uncertain is which prompts were drawn; the noise of a prompt is the same for both models.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

RESAMPLES = 9_999  # scipy's default
LEVEL = 0.95
SEED = 0


@dataclass(frozen=True)
class Estimate:
    """A mean over `n` prompts and its bootstrap interval [low, high] (NaN for fewer than 2 prompts)."""

    mean: float
    low: float
    high: float
    n: int

    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0

    def as_dict(self) -> dict:
        return asdict(self)


def estimate(values, seed: int = SEED, resamples: int = RESAMPLES, level: float = LEVEL) -> Estimate:
    """The mean of `values` and its percentile-bootstrap interval at `level`."""
    from scipy.stats import bootstrap

    values = np.asarray(values, dtype=np.float64)
    n = int(values.size)
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    mean = float(values.mean())
    if n < 2:
        return Estimate(mean, float("nan"), float("nan"), n)
    if np.all(values == values[0]):  # every resample has the same mean (scipy warns of degenerate data)
        return Estimate(mean, mean, mean, n)
    result = bootstrap((values,), np.mean, n_resamples=resamples, confidence_level=level, method="percentile",
                       vectorized=True, rng=np.random.default_rng(seed))  # fmt: skip
    interval = result.confidence_interval
    return Estimate(mean, float(interval.low), float(interval.high), n)


def paired_difference(model, base, seed: int = SEED) -> Estimate:
    """model - base per prompt (the same prompts, in the same order), its mean and interval."""
    model, base = np.asarray(model, dtype=np.float64), np.asarray(base, dtype=np.float64)
    if model.shape != base.shape:
        raise ValueError(f"paired scores differ in length: {model.shape} vs {base.shape}")
    return estimate(model - base, seed=seed)
