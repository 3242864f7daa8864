"""The token algorithms' losses (unirl_core/algorithms/token_base.py) against values derived here from the papers'
equations, token by token in plain floats: GRPO (DeepSeekMath eq. 3: PPO-clip per token, each completion's token
mean, the mean over completions, + beta k3 KL), DAPO (clip-higher, one mean over every token of the batch), Dr. GRPO
(token sums over completions x max_new_tokens; advantages without the std), GSPO (the sequence's length-normalized
ratio, clipped per sequence; its gradient on a token's log-prob is -A s / |y| / B while unclipped)."""

from __future__ import annotations

import math

import pytest
import torch

from unirl_core.algorithms.advantages import group_advantages
from unirl_core.algorithms.registry import algorithm_config, build_algorithm

LOGP = [[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]]
DELTA = [[0.3, -0.3, 0.0], [0.25, -0.05, 0.9]]  # logp - logp_old; row 1's last token is past its end (masked)
REF = [[-1.1, -1.9, -0.5], [-0.6, -1.3, -2.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -1.0]


def tensors():
    logp = torch.tensor(LOGP, requires_grad=True)
    old = logp.detach() - torch.tensor(DELTA)
    return logp, old, torch.tensor(REF), torch.tensor(ADV), torch.tensor(MASK, dtype=torch.float32)


def token_term(delta: float, advantage: float, low: float, high: float) -> float:
    ratio = math.exp(delta)
    return -min(ratio * advantage, min(max(ratio, 1 - low), 1 + high) * advantage)


def k3(logp: float, ref: float) -> float:
    return math.exp(ref - logp) - (ref - logp) - 1


def loss_of(name: str, normalizer_args=(2, 5, 4), **keys):
    algorithm = build_algorithm(algorithm_config({"name": name, **keys}))
    logp, old, ref, adv, mask = tensors()
    loss, metrics = algorithm.token_loss(logp, old, ref, adv, mask, algorithm.normalizer(*normalizer_args))
    return loss, metrics, logp


def rows(low: float, high: float, beta: float = 0.0) -> list[list[float]]:
    return [[token_term(DELTA[i][t], ADV[i], low, high) + beta * k3(LOGP[i][t], REF[i][t])
             for t in range(3) if MASK[i][t]] for i in range(2)]  # fmt: skip


def test_grpo_is_the_mean_over_completions_of_each_token_mean_with_k3_kl():
    loss, metrics, _ = loss_of("token_grpo", beta=0.04)
    expected = sum(sum(r) / len(r) for r in rows(0.2, 0.2, beta=0.04)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # row 0, token 0: ratio e^0.3 = 1.35 > 1.2 with A > 0: the clipped term is the minimum (1 of 5 tokens)
    assert metrics["clip_fraction"].item() == pytest.approx(1 / 5)
    assert metrics["ratio_max"].item() == pytest.approx(math.exp(0.3))  # the masked 0.9 is not counted


def test_dapo_clips_higher_and_averages_every_token_of_the_batch():
    loss, _, _ = loss_of("dapo")
    terms = [t for r in rows(0.2, 0.28) for t in r]
    assert loss.item() == pytest.approx(sum(terms) / 5, rel=1e-6)  # 5 unmasked tokens
    assert loss.item() != pytest.approx(sum(sum(r) / len(r) for r in rows(0.2, 0.28)) / 2, rel=1e-3)


def test_dr_grpo_divides_token_sums_by_completions_times_max_new_tokens():
    loss, _, _ = loss_of("dr_grpo")
    assert loss.item() == pytest.approx(sum(t for r in rows(0.2, 0.2) for t in r) / (2 * 4), rel=1e-6)


def test_dr_grpo_advantages_are_not_divided_by_the_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 1.0, 1.0])
    advantages, _ = group_advantages(rewards, 4, std_mode="none", clip=None)
    assert advantages.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 1.5, -0.5, -0.5, -0.5])
    assert algorithm_config({"name": "dr_grpo"}).std_mode == "none"


def test_gspo_clips_the_sequence_ratio_and_its_gradient_is_the_sequence_ratios():
    small = [[1e-4, -2e-4, 3e-4], [2e-4, 1e-4, 5.0]]  # inside GSPO's (1 - 3e-4, 1 + 4e-4) for row 0 and 1
    algorithm = build_algorithm(algorithm_config({"name": "gspo"}))
    logp, _, ref, adv, mask = tensors()
    old = logp.detach() - torch.tensor(small)
    loss, _ = algorithm.token_loss(logp, old, ref, adv, mask, algorithm.normalizer(2, 5, 4))
    s = [math.exp(sum(small[0]) / 3), math.exp(sum(small[1][:2]) / 2)]
    assert loss.item() == pytest.approx((-s[0] * ADV[0] - s[1] * ADV[1]) / 2, abs=1e-7)  # float32 of ~1 - ~1
    loss.backward()
    expected = [[-ADV[0] * s[0] / 3 / 2] * 3, [-ADV[1] * s[1] / 2 / 2] * 2 + [0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(expected), rtol=1e-5, atol=1e-8)

    big = [[0.01, 0.01, 0.01], [0.0, 0.0, 0.0]]  # row 0's ratio e^0.01 > 1 + 4e-4 with A > 0: clipped, no gradient
    logp.grad = None
    loss, _ = algorithm.token_loss(logp, logp.detach() - torch.tensor(big), ref, adv, mask, 2.0)
    loss.backward()
    assert loss.item() == pytest.approx((-(1 + 4e-4) * ADV[0] - 1.0 * ADV[1]) / 2, abs=1e-7)
    assert logp.grad[0].abs().max() == 0 and logp.grad[1, :2].abs().min() > 0


def test_the_first_update_has_ratio_exactly_one():
    algorithm = build_algorithm(algorithm_config({"name": "token_grpo"}))
    logp, _, _, adv, mask = tensors()
    _, metrics = algorithm.token_loss(logp, logp.detach(), None, adv, mask, 2.0)
    assert metrics["ratio_mean"].item() == 1.0 and metrics["clip_fraction"].item() == 0.0
