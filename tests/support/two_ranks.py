"""Two FSDP2 ranks (gloo, spawned processes) training one step of an algorithm on half a rollout each, for
tests/integration/test_two_ranks.py. Each rank builds the tiny SD3 itself (a fresh workspace: both build at once),
shards it, rolls out its 2 samples with the shared seed and trains with their advantages; rank 0 writes the full
(unsharded) trained weights and the step's gradient norm."""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch


def train_rank(rank: int, world: int, port: int, names: list[str], home: str, out: str) -> None:
    """One step of each algorithm in `names`; rank 0 writes `<out>-<name>.safetensors` and `.json`."""
    sys.path.insert(0, os.path.dirname(__file__))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), UNIRL_HOME=home)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    try:
        for name in names:
            for gather, suffix in ((True, ""), (False, "-resharded")):  # fsdp.reshard_after_forward false, true
                weights, grad_norm = one_step(name, rank, world, gather)
                if rank == 0:
                    from safetensors.torch import save_file

                    save_file({f"{i:04d}": w for i, w in enumerate(weights)}, f"{out}-{name}{suffix}.safetensors")
                    with open(f"{out}-{name}{suffix}.json", "w") as f:
                        json.dump({"grad_norm": grad_norm}, f)
    finally:
        torch.distributed.destroy_process_group()


def one_step(name: str, rank: int = 0, world: int = 1, gather: bool = True) -> tuple[list[torch.Tensor], float]:
    """One train call of `name` on this rank's share of the 4-sample rollout (all of it with world 1, unsharded);
    `gather`: each FSDP2 unit gathered once per rollout and per optimizer step (`fsdp.reshard_after_forward`
    false), else after every forward."""
    from unirl_core.config import recipe_from_tree
    from unirl_core.data.grpo_groups import expand_groups
    from unirl_core.data.sources import build_source
    from unirl_core.domains.diffusion.rollout.rollout import run_rollout
    from unirl_core.domains.diffusion.stack import build_stack
    from unirl_core.models.registry import build_family
    from unirl_core.worker.fsdp import full_value, gathered, parallelize

    config = recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": 2},
        "sampling": {"samples_per_prompt": 2, "num_inference_steps": 5, "guidance_scale": 1.0, "height": 32,
                     "width": 32},
        "model": {"family": "sd3", "path": "tiny:sd3"},
        "algorithm": {"name": name, "micro_batch_size": 2, "learning_rate": 1e-2},
    }}).train  # fmt: skip
    torch.manual_seed(0)
    adapter = build_family(config.model, config.sampling)
    if world > 1:
        parallelize(adapter.trainable, adapter.blocks(), torch.device("cpu"), config.fsdp, adapter.dtype)
    stack = build_stack(adapter, config.algorithm, gather=gather)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    share = len(samples) // world
    mine = slice(rank * share, (rank + 1) * share)
    with stack.rollout_policy(), gathered(adapter.trainable, gather):
        rollout = run_rollout(adapter, samples[mine], config.sampling, config.algorithm, seed=0, step=0)
    metrics = stack.train(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5])[mine], step=0)
    return [full_value(p.detach()).clone() for p in adapter.parameters()], metrics["grad_norm"]
