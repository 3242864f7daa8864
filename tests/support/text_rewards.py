"""A dense text reward for the autoregressive tests (a `package.module:function` reward): the fraction of a
completion's characters that are digits, so nearly every group of a random tiny model has rewards that differ."""

from __future__ import annotations

import numpy as np


def digit_fraction(outputs, prompts) -> np.ndarray:
    return np.array([sum(c.isdigit() for c in output) / max(len(output), 1) for output in outputs])
