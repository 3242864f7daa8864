"""The autoregressive train stack's batch: a NaN advantage puts a completion outside the step's batch (dynamic
sampling's left-out groups), and the update is then exactly the one on the other completions alone; a rollout
extended by a later one (re-padded prompts and completions) trains as the two rollouts' rows do."""

from __future__ import annotations

import torch

from unirl_core.config import load_recipe
from unirl_core.domains.ar.domain import ARRollout
from unirl_core.domains.ar.policy import LMPolicy
from unirl_core.domains.ar.stack import TokenStack
from unirl_core.models.tiny_lm import write_tiny_lm

PROMPTS = ["3+4=", "a longer prompt: 1+2=", "9+0=", "5+5 is"]


def setup(folder, algorithm: str):
    config = load_recipe("demo_llm", [f"train.model.path={folder}", "train.domain.max_new_tokens=5",
                                      f"train.algorithm.name={algorithm}", "train.algorithm.micro_batch_size=2"]).train  # fmt: skip
    torch.manual_seed(0)
    policy = LMPolicy(config, "cpu")
    return policy, TokenStack(policy, config.algorithm, gather=False), config


def rollout(policy, config, prompts, seed):
    generators = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    return ARRollout([None] * len(prompts), policy.generate(prompts, generators), config.domain)


def weights(policy) -> list[torch.Tensor]:
    return [p.detach().clone() for p in policy.parameters()]


def gradients(policy) -> list[torch.Tensor]:
    """The last update's gradients (kept until the next update's zero_grad), before Adam's scale-free step."""
    return [p.grad.clone() for p in policy.parameters()]


def test_nan_rows_are_outside_the_batch_for_every_loss_aggregation(tmp_path):
    folder = write_tiny_lm(tmp_path / "lm")
    for algorithm in ("token_grpo", "dapo", "dr_grpo"):
        policy, stack, config = setup(folder, algorithm)
        full = rollout(policy, config, PROMPTS, 0)
        start = weights(policy)
        stack.train(full, torch.tensor([1.0, float("nan"), -0.5, float("nan")]), 0)
        masked, masked_grads = weights(policy), gradients(policy)
        policy, stack, config = setup(folder, algorithm)  # the same initial weights
        subset = rollout(policy, config, [PROMPTS[0], PROMPTS[2]], 0)
        subset.completions = full.completions.__class__(**{  # rows 0 and 2 of the same completions
            k: (v[[0, 2]] if torch.is_tensor(v) else [v[0], v[2]] if isinstance(v, list) else v)
            for k, v in vars(full.completions).items()})  # fmt: skip
        stack.train(subset, torch.tensor([1.0, -0.5]), 0)
        for a, b in zip(masked_grads, gradients(policy), strict=True):  # the normalizer counts rows 0 and 2 only
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
        assert any(not torch.equal(a, s) for a, s in zip(masked, start, strict=True)), algorithm


def test_an_extended_rollout_keeps_each_rows_tokens_and_log_probs(tmp_path):
    policy, _, config = setup(write_tiny_lm(tmp_path / "lm"), "dapo")
    first, later = rollout(policy, config, PROMPTS[:2], 0), rollout(policy, config, PROMPTS[2:], 7)
    joined = first.extend(later)
    assert joined.outputs == first.outputs + later.outputs and len(joined.samples) == 4
    both = joined.completions
    for rows, part in ((range(0, 2), first.completions), (range(2, 4), later.completions)):
        for row, i in zip(rows, range(2), strict=True):
            n = int(part.mask[i].sum())
            assert both.ids[row, :n].tolist() == part.ids[i, :n].tolist() and int(both.mask[row].sum()) == n
            p = int(part.prompt_mask[i].sum())
            assert both.prompt_ids[row, -p:].tolist() == part.prompt_ids[i, -p:].tolist()
    torch.testing.assert_close(policy.token_logp(both) * both.mask, both.logp, rtol=0, atol=1e-5)
