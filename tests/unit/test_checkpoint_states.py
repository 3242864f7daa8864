"""Rank checkpoints as named states: a new stage starts from the trained weights with a fresh optimizer.

Before issue 14 the weights-only load called `get_state_dict(module, optimizer)`, which initializes a fresh
optimizer's state (AdamW: step 1, zero moments): the RL stage after a warm-up then ran one Adam step ahead (its first
update about 0.74x the size). Loading `model` alone leaves the optimizer untouched."""

from __future__ import annotations

import torch

from unirl_core.worker.checkpoint import CheckpointManager, ModelState, OptimizerState, RankCheckpoint


def trained(seed: int):
    torch.manual_seed(seed)
    module = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1, weight_decay=0.0)
    module(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # as a worker loads: right after building, before any backward
    return module, optimizer


def save(tmp_path, module, optimizer):
    folder = CheckpointManager(tmp_path).prepare(0)
    parts = RankCheckpoint({"model": ModelState(module), "optim": OptimizerState(module, optimizer)}).save(folder)
    return CheckpointManager(tmp_path).commit(folder, {"step": 0, **parts})


def test_weights_only_load_leaves_a_fresh_optimizer_fresh(tmp_path):
    folder = save(tmp_path, *trained(0))
    module, _ = trained(1)
    fresh = torch.optim.AdamW(module.parameters(), lr=0.1, weight_decay=0.0)
    RankCheckpoint({"model": ModelState(module), "optim": OptimizerState(module, fresh)}).load(
        folder, weights_only=True
    )
    source, _ = trained(0)
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), source.parameters(), strict=True))
    assert fresh.state == {}  # no phantom step: the stage's first update is Adam's step 1


def test_a_full_load_restores_weights_and_optimizer(tmp_path):
    source, source_optimizer = trained(0)
    folder = save(tmp_path, source, source_optimizer)
    module, _ = trained(1)
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1, weight_decay=0.0)
    RankCheckpoint({"model": ModelState(module), "optim": OptimizerState(module, optimizer)}).load(folder)
    assert all(torch.equal(a, b) for a, b in zip(module.parameters(), source.parameters(), strict=True))
    for parameter, expected in zip(module.parameters(), source.parameters(), strict=True):
        state, want = optimizer.state[parameter], source_optimizer.state[expected]
        assert state["step"].item() == want["step"].item() == 1
        assert torch.equal(state["exp_avg"], want["exp_avg"]) and torch.equal(state["exp_avg_sq"], want["exp_avg_sq"])


def test_keys_added_since_a_checkpoint_was_written_keep_its_hash_at_their_absent_value():
    """`train.reward.llm_judge`, the video keys and the token algorithms' `dynamic_sampling` / `max_gen_batches` came after
    checkpoints of these recipes were written (the hashes 5d0151b computed): at the value their absence meant, the
    hash is unchanged, so those checkpoints resume; set otherwise, the hash changes (DAPO's dynamic sampling, now
    on by default, refuses a checkpoint trained without it)."""
    from unirl_core.config import load_recipe
    from unirl_core.worker.checkpoint import config_hash

    assert config_hash(load_recipe("demo", []).train) == "70e516967068d97f"
    assert config_hash(load_recipe("demo_llm", []).train) == "735135dc6fbd5f9a"
    remote = ["train.reward.weights={judge: 1.0}", "train.reward.remote={judge: {url: 'http://127.0.0.1:9/score'}}"]
    assert config_hash(load_recipe("demo", remote).train) == "220f1bf8380c9ccb"  # a remote scorer's `videos` came later
    dapo = load_recipe("demo_llm", ["train.algorithm.name=dapo"]).train
    without = load_recipe("demo_llm", ["train.algorithm.name=dapo", "train.algorithm.dynamic_sampling=false"]).train
    assert config_hash(dapo) != config_hash(without)
