"""The numbers of `unirl eval`'s table against numbers derived by hand: the bootstrap interval of a mean is close to
the normal approximation mean +- 1.96 sd / sqrt(n) on a large sample; a paired difference is the interval of the
per-prompt differences, not of the two means apart."""

from __future__ import annotations

import math

import numpy as np
import pytest

from unirl_core.evaluation.stats import estimate, paired_difference


def test_the_interval_of_a_mean_matches_the_normal_approximation():
    values = [0.0, 1.0] * 200  # mean 0.5, population sd 0.5: the 95 % half-width is 1.96 * 0.5 / 20 = 0.049
    result = estimate(values)
    assert result.mean == 0.5 and result.n == 400
    assert result.low == pytest.approx(0.5 - 0.049, abs=0.006) and result.high == pytest.approx(0.5 + 0.049, abs=0.006)
    assert estimate(values) == result  # a fixed seed: the same table on every run


def test_a_paired_difference_sees_a_shift_the_spread_between_prompts_hides():
    rng = np.random.default_rng(1)
    base = rng.normal(0.0, 1.0, 50)  # prompts differ a lot from each other
    model = base + 0.05 + rng.normal(0.0, 0.01, 50)  # every prompt gains about 0.05
    paired = paired_difference(model, base)
    assert paired.mean == pytest.approx(float(np.mean(model - base)))
    assert paired.low > 0.04 and paired.high < 0.06 and paired.excludes_zero()
    apart = estimate(model), estimate(base)  # the two intervals overlap: unpaired, the gain is invisible
    assert apart[0].low < apart[1].high


def test_no_gain_keeps_zero_inside_the_interval():
    rng = np.random.default_rng(2)
    base = rng.normal(0.0, 1.0, 64)
    assert not paired_difference(base + rng.normal(0.0, 0.1, 64), base).excludes_zero()


def test_small_and_constant_samples():
    one = estimate([0.3])
    assert one.mean == 0.3 and math.isnan(one.low) and math.isnan(one.high) and one.n == 1
    assert estimate([]).n == 0 and math.isnan(estimate([]).mean)
    assert estimate([2.0, 2.0, 2.0]).low == estimate([2.0, 2.0, 2.0]).high == 2.0
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0, 2.0], [1.0])
