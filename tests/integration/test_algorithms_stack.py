"""Every named algorithm through the real rollout and train stack on the tiny families (no Ray): pi_old is exact,
the loss is finite and moves the weights; the convention keys change what a user would see (which steps train, which
samples count, where gradients flow)."""

from __future__ import annotations

import pytest
import torch

from unirl_core.config import recipe_from_tree
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack, build_stack
from unirl_core.errors import UserError
from unirl_core.models.registry import build_family

pytestmark = pytest.mark.slow

WINDOWED = {  # tiny-run windows; one update, so every ratio is against the unchanged pi_old
    "mixgrpo": {"sde_window": {"size": 2}},
    "mixgrpo_flash": {"sde_window": {"size": 2}},
    "flow_dppo": {"sde_window": {"size": 2}, "num_updates_per_batch": 1},
}


def setup(family="sd3", guidance=1.0, steps=5, **algorithm):
    config = recipe_from_tree(
        {
            "train": {
                "data": {"source": "smoke", "prompts_per_rollout": 2},
                "sampling": {
                    "samples_per_prompt": 2,
                    "num_inference_steps": steps,
                    "guidance_scale": guidance,
                    "height": 32,
                    "width": 32,
                },
                "model": {"family": family, "path": f"tiny:{family}"},
                "algorithm": {"micro_batch_size": 2, "learning_rate": 1e-2, **algorithm},
            }
        }  # fmt: skip
    ).train
    torch.manual_seed(0)
    adapter = build_family(config.model, config.sampling)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    return config, adapter, samples


def lora_weights(adapter) -> list[torch.Tensor]:
    return [p.detach().clone() for p in adapter.parameters()]


@pytest.mark.parametrize(
    "name", ["grpo", "flow_grpo_fast", "mixgrpo", "mixgrpo_flash", "dancegrpo", "grpo_guard", "flow_dppo"]
)
def test_each_algorithm_trains_from_an_exact_pi_old(name):
    config, adapter, samples = setup(name=name, **WINDOWED.get(name, {}))
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0, step=3)
    stack = TrainStack(adapter, config.algorithm)
    before = lora_weights(adapter)
    metrics = stack.train(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5]), step=3)
    assert metrics["ratio_min"] == 1.0 and metrics["ratio_max"] == 1.0  # pi_old recomputed at the same geometry
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, lora_weights(adapter), strict=True))
    if name in ("flow_grpo_fast", "mixgrpo", "mixgrpo_flash", "flow_dppo"):  # a window: only its steps are trained
        assert len(rollout.steps) == 2
    if name == "mixgrpo_flash":  # window 0-1, then the 3 ODE steps thinned to int(4 x 0.4) - 1 -> 1: grid 0, 1, 2, 5
        assert rollout.schedule == [adapter.schedule(5, rollout.final_latents.shape[1:])[i] for i in (0, 1, 2, 5)]
    if name == "dancegrpo":  # every step but the last stochastic, int(0.6 x 4) = 2 trained per sample
        assert rollout.steps == [0, 1, 2, 3] and rollout.trained().shape == (4, 2)


def test_mixgrpos_empty_window_rolls_out_with_the_ode_and_leaves_the_weights():
    """5 steps: windows end at 5 - 2 = 3, so position 3 (RL step 3 with a shift every step) is empty, as MixGRPO's
    code: nothing stored, nothing trained, the weights unchanged, the step's metrics without ratios."""
    config, adapter, samples = setup(name="mixgrpo", sde_window={"size": 2, "shift_every": 1})
    windows = [run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0, step=k).steps for k in range(5)]
    assert windows == [[0, 1], [1, 2], [2], [], [0, 1]]
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0, step=3)
    before = lora_weights(adapter)
    metrics = TrainStack(adapter, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5]), step=3)
    assert metrics["grad_norm"] == 0.0 and "ratio_min" not in metrics
    assert all(torch.equal(a, b) for a, b in zip(before, lora_weights(adapter), strict=True))


def test_random_timesteps_train_the_same_whatever_the_micro_batch():
    """Samples training different steps are grouped by step inside a micro-batch; the update must not depend on
    how the batch is cut (micro-batch 4: groups of mixed steps; 1: one sample at a time)."""
    grads = []
    for micro in (4, 1):
        config, adapter, samples = setup(name="dancegrpo", micro_batch_size=micro)
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
        assert len({tuple(row) for row in rollout.trained().tolist()}) > 1
        stack = TrainStack(adapter, config.algorithm)
        stack.train(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5]), step=0)
        grads.append(torch.cat([p.grad.flatten() for p in adapter.parameters()]))  # the last update's
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


def test_zero_advantage_samples_leave_the_mean_when_dropped():
    """flow_grpo drops samples whose advantage is exactly 0: at ratio 1 the grpo loss is -mean(A) over the kept."""
    advantages = torch.tensor([0.0, 0.0, 1.0, 0.5])
    losses = {}
    for drop in (False, True):
        config, adapter, samples = setup(drop_zero_advantage=drop, micro_batch_size=4)
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
        losses[drop] = TrainStack(adapter, config.algorithm).train(rollout, advantages, step=0)["loss"]
    assert losses[False] == pytest.approx(-0.375) and losses[True] == pytest.approx(-0.75)


def test_detaching_the_unconditional_branch_keeps_the_loss_and_changes_the_gradient():
    grads, losses = [], []
    for mode in ("both", "detach_uncond"):
        config, adapter, samples = setup(guidance=4.5, cfg_gradient=mode)
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
        stack = TrainStack(adapter, config.algorithm)
        losses.append(stack.train(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5]), step=0)["loss"])
        grads.append(torch.cat([p.grad.flatten() for p in adapter.parameters()]))  # the last update's
    assert losses[0] == losses[1] and not torch.allclose(grads[0], grads[1])


@pytest.mark.parametrize("sde_type", ["cps", "dance"])
def test_flow_samplers_roll_out_and_a_ddim_family_refuses_them(sde_type):
    config, adapter, samples = setup(sde_type=sde_type)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    assert torch.isfinite(rollout.logp_TB).all() and len(rollout.images) == 4
    config, adapter, samples = setup(family="sd15", sde_type=sde_type)
    with pytest.raises(UserError, match=f"sde_type: '{sde_type}' does not apply to family 'sd15'"):
        run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)


class Killed(Exception):
    """Stands in for a kill: raised after a step was logged, before anything later is committed."""


@pytest.mark.parametrize("family", ["sd3", "sd15"])
def test_diffusion_nft_samples_from_the_old_policy_and_moves_it_after_the_step(family):
    """ODE rollouts, nothing stored per step; the update moves the trained weights, then the old policy follows by
    1 - decay (0.999 after the first optimizer step), and rollouts come from it."""
    config, adapter, samples = setup(family=family, name="diffusion_nft", steps=4)
    stack = build_stack(adapter, config.algorithm)
    with stack.rollout_policy():
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0, step=0)
    assert rollout.latents_TB.shape[0] == 0 and rollout.steps == [0, 1, 2, 3]
    assert rollout.trained().shape == (4, 3)  # int(4 x 0.99) = 3 grid steps per sample
    before = lora_weights(adapter)
    metrics = stack.train(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5]), step=0)
    after = lora_weights(adapter)
    assert metrics["old_decay"] == pytest.approx(0.001) and metrics["r_mean"] == pytest.approx(0.5)
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    for old, initial, new in zip(stack.algorithm.old.shadow, before, after, strict=True):
        assert torch.allclose(old, 0.001 * initial + 0.999 * new, atol=1e-6)
    with stack.rollout_policy():
        assert all(
            torch.equal(p.detach(), o) for p, o in zip(adapter.parameters(), stack.algorithm.old.shadow, strict=True)
        )
    assert all(torch.equal(p.detach(), a) for p, a in zip(adapter.parameters(), after, strict=True))


def test_diffusion_nft_trains_the_same_whatever_the_micro_batch():
    """The fresh noise of each (sample, trained slot) derives from (seed, sample id): cutting the batch differently
    gives the same gradient."""
    grads = []
    for micro in (4, 1):
        config, adapter, samples = setup(name="diffusion_nft", micro_batch_size=micro, steps=4)
        stack = build_stack(adapter, config.algorithm)
        rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
        stack.train(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5]), step=0)
        grads.append(torch.cat([p.grad.flatten() for p in adapter.parameters()]))
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


RESUMED = {  # recipe -> its overrides at 4 denoising steps
    "demo_flow_grpo_fast": [], "demo_mixgrpo_flash": [], "demo_dancegrpo": [], "demo_grpo_guard": [],
    "demo_flow_dppo": ["train.algorithm.sde_window.size=2"], "demo_diffusion_nft": [],  # 2 of the first half
}  # fmt: skip


@pytest.mark.parametrize("recipe", list(RESUMED))
def test_a_killed_run_resumes_on_the_same_windows_and_steps(recipe, tmp_path):
    """The SDE windows (Fast's random one, MixGRPO-Flash's sliding one with its thinned ODE steps, FlowDPPO's
    subset) and the per-sample trained steps are functions of the RL step, DiffusionNFT's old policy is
    checkpointed: a run killed at step 6 resumes from its step-5 checkpoint to the uninterrupted run, bitwise.
    (`demo_mixgrpo` is `demo_mixgrpo_flash` without the thinning: the same window code.)"""
    from local_training import comparable, train_locally

    from unirl_core.config import load_recipe

    config = load_recipe(
        recipe, ["train.steps=8", "train.checkpoint_every=2", "train.sampling.num_inference_steps=4", *RESUMED[recipe]]
    ).train
    uninterrupted = train_locally(config, tmp_path / "whole")

    def kill_at_6(row: dict) -> None:
        first.append(row)
        if row["step"] == 6:
            raise Killed

    first: list[dict] = []
    with pytest.raises(Killed):
        train_locally(config, tmp_path / "killed", on_step=kill_at_6)
    resumed = train_locally(config, tmp_path / "killed")
    assert resumed[0]["step"] == 6
    assert comparable(first[:6] + resumed) == comparable(uninterrupted)
