"""Mixed precision on the tiny SD3 in bfloat16 (CPU, one gloo rank): float32 master weights and AdamW state, bf16
frozen weights and compute, float32 log-probs (the first ratio exactly 1), and a small update that survives where
the old pure-bf16 path rounded it away; float16 is refused before training."""

from __future__ import annotations

import pytest
import torch

from unirl_core.config import recipe_from_tree
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.distributed.local_group import LocalGroup
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack
from unirl_core.models.registry import build_family
from unirl_core.worker import fsdp

pytestmark = pytest.mark.slow


def train_config(dtype: str = "bfloat16", **algorithm):
    return recipe_from_tree(
        {
            "train": {
                "data": {"source": "smoke", "prompts_per_rollout": 2},
                "sampling": {"samples_per_prompt": 2, "num_inference_steps": 3, "height": 32, "width": 32},
                "model": {"family": "sd3", "path": "tiny:sd3", "dtype": dtype},
                "algorithm": {"eta": 1.0, "micro_batch_size": 2, **algorithm},
                "steps": 2,
            }
        }
    ).train


def test_a_bf16_model_trains_float32_lora_with_bf16_compute_and_keeps_a_small_update():
    config = train_config(learning_rate=1e-5)
    torch.manual_seed(0)
    adapter = build_family(config.model, config.sampling)
    trained = {n: p for n, p in adapter.trainable.named_parameters() if p.requires_grad}
    assert trained and {p.dtype for p in trained.values()} == {torch.float32}  # master weights
    assert {p.dtype for p in adapter.trainable.parameters() if not p.requires_grad} == {torch.bfloat16}
    with torch.no_grad():  # an adapter already trained a while: B != 0 (A gets gradients), weights >> lr
        for name, parameter in trained.items():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.1)
    inputs: set[torch.dtype] = set()
    hooks = [
        m.register_forward_pre_hook(lambda module, args: inputs.add(args[0].dtype))
        for m in adapter.trainable.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    with LocalGroup():  # one gloo rank: FSDP2 as a worker runs it
        fsdp.parallelize(adapter.trainable, adapter.blocks(), torch.device("cpu"), config.fsdp, adapter.dtype)
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
        stack = TrainStack(adapter, config.algorithm)
        before = [fsdp.full_value(p.detach()).clone() for p in adapter.parameters()]
        metrics = stack.train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
        after = [fsdp.full_value(p.detach()) for p in adapter.parameters()]
        grads = [fsdp.full_value(p.grad) for p in adapter.parameters()]
        state = [t for s in stack.optimizer.state.values() for t in s.values()]
    for hook in hooks:
        hook.remove()
    assert inputs == {torch.bfloat16}  # every matmul (frozen and LoRA) computed in bf16
    assert rollout.logp_TB.dtype == torch.float32
    assert metrics["ratio_mean"] == 1.0 and metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0
    assert state and {t.dtype for t in state} == {torch.float32}  # AdamW's step, exp_avg, exp_avg_sq
    assert {p.dtype for p in adapter.parameters()} == {torch.float32}
    total = sum(b.numel() for b in before)
    changed = sum(int((a != b).sum()) for a, b in zip(after, before, strict=True)) / total
    assert changed > 0.9, changed  # lr 1e-5: AdamW's first step moves every weight with a gradient by ~lr
    # the old path: the same weights, gradients and step with bf16 parameters and bf16 AdamW state
    old = [torch.nn.Parameter(b.bfloat16()) for b in before]
    for parameter, grad in zip(old, grads, strict=True):
        parameter.grad = grad.bfloat16()
    torch.optim.AdamW(old, lr=metrics["lr"], weight_decay=0.0).step()
    old_changed = sum(int((o.detach() != b.bfloat16()).sum()) for o, b in zip(old, before, strict=True)) / total
    assert old_changed < 0.05, old_changed  # the update is below half a bf16 ulp of nearly every weight: lost


def test_float16_is_refused_before_training():
    from unirl_core.controller.round_plan import TrainingConfigError, validate

    validate(train_config("bfloat16"))
    with pytest.raises(TrainingConfigError, match=r"train\.model\.dtype: 'float16' cannot train"):
        validate(train_config("float16"))
