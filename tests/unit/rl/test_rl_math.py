"""The RL math against independent references: log-probs vs float64 Gaussians and diffusers' DDIM step,
advantages on hand-made groups, PPO clipping, KL, rewards."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.algorithms.advantages import PerPromptStatTracker, group_advantages
from unirl_core.algorithms.losses import gaussian_kl, ppo_clip_loss
from unirl_core.domains.diffusion.rollout.samplers import ddim_step, flow_sde_step
from unirl_core.rewards import functions
from unirl_core.rewards.service import RewardError, RewardService


def reference_log_prob(x, mean, std) -> torch.Tensor:
    normal = torch.distributions.Normal(mean.double(), torch.as_tensor(std, dtype=torch.float64))
    return normal.log_prob(x.double()).mean(dim=(1, 2, 3))


@pytest.mark.parametrize(("sigma", "sigma_next", "eta"), [(0.9, 0.8, 0.7), (0.5, 0.3, 1.0), (1.0, 0.95, 0.7)])
def test_flow_sde_log_prob_equals_a_float64_gaussian(sigma, sigma_next, eta):
    generator = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 4, 8, 8, generator=generator), torch.randn(3, 4, 8, 8, generator=generator)
    step = flow_sde_step(v, x, sigma, sigma_next, eta, sigma_max=0.95, generator=generator)
    # the equations of RL.md, independently, in float64
    denominator = 1 - (0.95 if sigma == 1 else sigma)
    std_t = eta * math.sqrt(sigma / denominator)
    dt = sigma_next - sigma
    mean = x.double() * (1 + std_t**2 / (2 * sigma) * dt) + v.double() * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    std = std_t * math.sqrt(-dt)
    assert torch.allclose(step.mean.double(), mean, atol=1e-5)
    assert math.isclose(step.std.item(), std, rel_tol=1e-6)
    assert torch.allclose(step.log_prob.double(), reference_log_prob(step.sample, mean, std), atol=1e-4)
    again = flow_sde_step(v, x, sigma, sigma_next, eta, sigma_max=0.95, prev_sample=step.sample)
    assert torch.equal(again.log_prob, step.log_prob)  # re-evaluating a stored transition gives the same log-prob


def test_ddim_step_matches_diffusers_and_a_float64_gaussian():
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012, clip_sample=False, set_alpha_to_one=False, steps_offset=1)  # fmt: skip
    scheduler.set_timesteps(10)
    t, t_prev = int(scheduler.timesteps[3]), int(scheduler.timesteps[4])
    a_t, a_prev = scheduler.alphas_cumprod[t].item(), scheduler.alphas_cumprod[t_prev].item()
    generator = torch.Generator().manual_seed(1)
    x, eps, noise = (torch.randn(2, 4, 8, 8, generator=generator) for _ in range(3))
    expected = scheduler.step(eps, t, x, eta=1.0, variance_noise=noise).prev_sample
    step = ddim_step(eps, x, a_t, a_prev, eta=1.0, prev_sample=expected)
    assert torch.allclose(step.mean + step.std * noise, expected, atol=1e-5)
    assert torch.allclose(step.log_prob.double(), reference_log_prob(expected, step.mean, step.std.item()), atol=1e-4)
    deterministic = ddim_step(eps, x, a_t, a_prev, eta=0.0)
    assert deterministic.log_prob is None
    assert torch.allclose(deterministic.sample, scheduler.step(eps, t, x, eta=0.0).prev_sample, atol=1e-5)


def test_group_advantages_on_hand_made_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 3.0])
    advantages, stats = group_advantages(rewards, group_size=4, clip=None)
    assert torch.equal(advantages[:4], torch.zeros(4))  # equal rewards: no signal
    assert stats["zero_std_ratio"] == 0.5
    std = np.std([0.0, 1.0, 2.0, 3.0])
    expected = torch.tensor([(r - 1.5) / (std + 1e-4) for r in (0, 1, 2, 3)], dtype=torch.float32)
    assert torch.allclose(advantages[4:], expected, atol=1e-6)
    batch, _ = group_advantages(rewards, group_size=4, std_mode="batch", clip=None)
    assert torch.allclose(
        batch[4:], torch.tensor([(r - 1.5) / (rewards.std(unbiased=False) + 1e-4) for r in (0, 1, 2, 3)]), atol=1e-5
    )
    clipped, _ = group_advantages(torch.tensor([0.0, 0.0, 0.0, 100.0]), group_size=4, clip=1.0)
    assert clipped.abs().max() == 1.0
    with pytest.raises(ValueError, match="do not split into groups of 3"):
        group_advantages(rewards, group_size=3)


def test_per_prompt_tracker_uses_batch_stats_until_min_count():
    tracker = PerPromptStatTracker(buffer_size=8, min_count=4)
    first = tracker.update(["a", "a", "b", "b"], torch.tensor([1.0, 3.0, 10.0, 12.0]))
    batch = torch.tensor([1.0, 3.0, 10.0, 12.0])
    assert torch.allclose(first, (batch - batch.mean()) / (batch.std(unbiased=False) + 1e-6), atol=1e-5)
    second = tracker.update(["a", "a", "b", "b"], torch.tensor([1.0, 3.0, 10.0, 12.0]))
    assert torch.allclose(second, torch.tensor([-1.0, 1.0, -1.0, 1.0]), atol=1e-5)  # now per prompt
    restored = PerPromptStatTracker(buffer_size=8, min_count=4)
    restored.load_state_dict(tracker.state_dict())
    assert restored.state_dict() == tracker.state_dict()


def test_ppo_ratio_one_and_clipping():
    logp = torch.randn(6)
    advantages = torch.tensor([1.0, -1.0, 2.0, -2.0, 0.5, 0.0])
    loss, metrics = ppo_clip_loss(logp, logp.clone(), advantages, clip_range=1e-4)
    assert metrics["ratio_mean"] == 1 and metrics["clip_fraction"] == 0
    assert torch.equal(loss, -advantages)  # per-sample terms
    new = (logp + 0.01).requires_grad_()  # ratio ~ 1.01: outside the 1e-4 band
    loss, metrics = ppo_clip_loss(new, logp, torch.ones(6), clip_range=1e-4)
    assert metrics["clip_fraction"] == 1
    loss.mean().backward()
    assert torch.equal(new.grad, torch.zeros(6))  # positive advantage, ratio above the band: clipped, no gradient


def test_gaussian_kl():
    mean = torch.randn(2, 4, 4, 4)
    assert torch.equal(gaussian_kl(mean, mean, torch.tensor(0.3)), torch.zeros(2))
    assert torch.allclose(gaussian_kl(mean + 0.3, mean, torch.tensor(0.3)), torch.full((2,), 0.5))


def test_jpeg_compressibility_prefers_flat_images():
    flat = Image.new("RGB", (64, 64), (120, 130, 140))
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    scores = functions.jpeg_compressibility([flat, noise])
    assert scores[0] > scores[1]
    assert np.allclose(functions.jpeg_incompressibility([flat, noise]), -scores)
    stats = {
        name: functions.REWARDS[name]([flat, noise])
        for name in ("edge_density", "colour_entropy", "brightness", "dark_fraction")
    }
    assert (
        stats["edge_density"][0] < stats["edge_density"][1] and stats["colour_entropy"][0] < stats["colour_entropy"][1]
    )


def test_reward_service_totals_and_refuses_nan(monkeypatch):
    images = [Image.new("RGB", (16, 16), (i * 60, 0, 0)) for i in range(3)]
    service = RewardService({"jpeg_compressibility": 1.0, "brightness": 2.0}, guards=["edge_density"])
    scored = service.score(images, ["p"] * 3, ["prompt:0:sample:0", "prompt:0:sample:1", "prompt:0:sample:2"])
    assert np.allclose(scored["total"], scored["jpeg_compressibility"] + 2 * scored["brightness"])
    assert set(scored) == {"total", "jpeg_compressibility", "brightness", "edge_density"}
    monkeypatch.setitem(functions.REWARDS, "broken", lambda images, prompts: np.array([1.0, float("nan"), 2.0]))
    with pytest.raises(RewardError, match=r"reward broken is NaN or infinite for samples \['prompt:0:sample:1'\]"):
        RewardService({"broken": 1.0}).score(
            images, ["p"] * 3, ["prompt:0:sample:0", "prompt:0:sample:1", "prompt:0:sample:2"]
        )
    with pytest.raises(ValueError, match=r"unknown reward\(s\) \['sharpness'\]"):
        RewardService({"sharpness": 1.0})


def test_lr_schedules_warm_up_then_hold_or_decay_to_zero():
    from unirl_core.worker.optim import lr_factor

    assert [lr_factor(s, 10, "constant", 0) for s in (0, 5, 9)] == [1.0, 1.0, 1.0]
    assert [round(lr_factor(s, 10, "cosine", 3), 4) for s in (0, 1, 2)] == [0.25, 0.5, 0.75]  # linear warm-up
    cosine = [lr_factor(s, 10, "cosine", 0) for s in range(11)]
    assert cosine[0] == 1.0 and math.isclose(cosine[5], 0.5) and cosine[10] < 1e-12
    assert all(a >= b for a, b in zip(cosine, cosine[1:], strict=False))


def test_per_prompt_std_mode_uses_the_tracker_and_clips():

    from unirl_core.algorithms.advantages import compute_advantages
    from unirl_core.algorithms.registry import algorithm_config

    algorithm = algorithm_config({"std_mode": "per_prompt", "tracker_min_count": 2, "adv_clip": 1.5})
    tracker = PerPromptStatTracker(algorithm.tracker_buffer_size, algorithm.tracker_min_count)
    prompts = ["a", "a", "b", "b"]
    advantages, stats = compute_advantages(algorithm, tracker, prompts, [1.0, 3.0, 10.0, 10.0], 2)
    # each prompt already has 2 rewards: its own mean/std; equal rewards -> 0 and counted in zero_std_ratio
    assert advantages.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0], abs=1e-4)
    assert stats["zero_std_ratio"] == 0.5
    advantages, _ = compute_advantages(algorithm, tracker, prompts, [100.0, 3.0, 10.0, 10.0], 2)
    assert advantages.abs().max().item() == 1.5  # adv_clip


def test_reinforce_is_the_on_policy_gradient_and_refuses_several_updates():
    from unirl_core.algorithms.losses import policy_gradient_loss
    from unirl_core.config import RecipeError, recipe_from_tree

    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, 0.5])
    loss, info = policy_gradient_loss(logp, logp.detach(), advantages)
    loss.mean().backward()
    assert torch.allclose(logp.grad, -advantages / 3) and info["ratio_mean"] == 1.0
    with pytest.raises(RecipeError, match="num_updates_per_batch"):
        recipe_from_tree({"train": {"algorithm": {"name": "reinforce", "num_updates_per_batch": 2}}})


def test_a_kl_term_without_lora_is_refused_at_validation():
    from unirl_core.config import RecipeError, recipe_from_tree

    with pytest.raises(RecipeError, match="algorithm.beta"):
        recipe_from_tree({"train": {"model": {"lora": None}, "algorithm": {"beta": 0.01}}})


def test_per_reward_normalization_weighs_rewards_by_their_weights_not_their_ranges():
    """`reward.normalize: per_reward` (GDPO): each reward normalized within its group, the weighted sum standardized
    over the batch. Two groups of 3; `wide` spans 100s, `narrow` 0.1s and disagrees with it."""
    from unirl_core.algorithms.advantages import compute_advantages, per_reward_advantages
    from unirl_core.algorithms.registry import algorithm_config
    from unirl_core.config import RecipeError, recipe_from_tree

    algorithm = algorithm_config({"adv_eps": 1e-4})
    prompts = ["a"] * 3 + ["b"] * 3
    wide, narrow = [0.0, 100.0, 200.0, 50.0, 150.0, 100.0], [0.3, 0.2, 0.1, 0.1, 0.1, 0.2]
    weights = {"wide": 0.5, "narrow": 1.0}
    advantages, stats = per_reward_advantages(algorithm, prompts, {"wide": wide, "narrow": narrow}, weights, 3)

    def in_groups(r):  # numpy, population std per group of 3
        r = np.asarray(r).reshape(2, 3)
        return ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-4)).ravel()

    summed = 0.5 * in_groups(wide) + 1.0 * in_groups(narrow)
    expected = (summed - summed.mean()) / (summed.std() + 1e-4)
    assert advantages.tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    # group a: narrow (weight 1) outvotes wide (weight 0.5): sample 0 is the best
    assert advantages[0] > advantages[1] > advantages[2]
    total = [0.5 * w + n for w, n in zip(wide, narrow, strict=True)]
    by_total, _ = compute_advantages(algorithm, PerPromptStatTracker(), prompts, total, 3)
    assert by_total[0] < by_total[1] < by_total[2]  # the summed raw rewards follow the wide range instead
    scaled, _ = per_reward_advantages(
        algorithm, prompts, {"wide": [w * 1e3 for w in wide], "narrow": narrow}, weights, 3
    )
    assert torch.allclose(scaled, advantages, atol=1e-4)  # a reward's units do not matter
    assert stats["zero_std_ratio"] == 0.0
    flat_b = {"wide": wide[:3] + [7.0] * 3, "narrow": narrow[:3] + [0.5] * 3}  # group b: all equal, both rewards
    flat, stats = per_reward_advantages(algorithm, prompts, flat_b, weights, 3)
    assert flat[3:].tolist() == [0.0] * 3 and stats["zero_std_ratio"] == 0.5  # exactly 0: drop_zero_advantage drops it
    with pytest.raises(RecipeError, match="reward.normalize"):
        recipe_from_tree({"train": {"reward": {"normalize": "per_reward"}, "algorithm": {"std_mode": "per_prompt"}}})


# MixGRPO's advantage_aggr (train_grpo_flux.py, multi_reward_mix) by hand: two groups of 3, torch's N - 1 std + 1e-8
# per reward and group, weights {1, 1, 2} normalized to {0.25, 0.25, 0.5}, summed, no second normalization:
#   hps [1, 2, 3 | 0, 0, 3]     -> [-1, 0, 1 | -0.57735, -0.57735, 1.154701]
#   ir  [.5, .5, 2 | 1, 2, 3]   -> [-0.57735, -0.57735, 1.154701 | -1, 0, 1]
#   pick [10, 20, 30 | 5, 5, 5] -> [-1, 0, 1 | 0, 0, 0]
MIXGRPO_AGGREGATED = [-0.8943376, -0.1443376, 1.0386751, -0.3943376, -0.1443376, 0.5386751]


def test_advantage_aggr_is_mixgrpos_weighted_sum_of_per_reward_group_advantages():
    from unirl_core.algorithms.advantages import per_reward_advantages
    from unirl_core.algorithms.registry import algorithm_config
    from unirl_core.config import RecipeError, recipe_from_tree

    algorithm = algorithm_config({"name": "mixgrpo"})
    prompts = ["a"] * 3 + ["b"] * 3
    rewards = {"hps": [1, 2, 3, 0, 0, 3], "ir": [0.5, 0.5, 2, 1, 2, 3], "pick": [10, 20, 30, 5, 5, 5]}
    weights = {"hps": 1.0, "ir": 1.0, "pick": 2.0}
    aggregated, _ = per_reward_advantages(algorithm, prompts, rewards, weights, 3, mode="advantage_aggr")
    assert aggregated.tolist() == pytest.approx(MIXGRPO_AGGREGATED, abs=1e-6)
    gdpo, _ = per_reward_advantages(algorithm, prompts, rewards, weights, 3, mode="per_reward")
    assert gdpo.tolist() == pytest.approx((aggregated / aggregated.std()).tolist(), abs=1e-5)  # GDPO standardizes
    smoke = {"source": "smoke"}
    config = recipe_from_tree({"train": {"data": smoke, "reward": {"normalize": "advantage_aggr"}}}).train
    assert config.reward.normalize == "advantage_aggr"
    per_prompt = {"data": smoke, "reward": {"normalize": "advantage_aggr"}, "algorithm": {"std_mode": "per_prompt"}}
    with pytest.raises(RecipeError, match="reward.normalize: got 'advantage_aggr'"):
        recipe_from_tree({"train": per_prompt})


def test_flow_dppo_recipe_and_preset_normalize_as_unirls_sd3_recipe():
    """UniRL's SD3 FlowDPPO (adv_use_global_std: true): (r - group mean) / (batch std, N - 1, + 1e-8). By hand for
    [1, 2, 3 | 2, 2, 5]: group means 2, 3; batch std sqrt(9.5 / 5) = 1.3784049 -> [-1, 0, 1, -1, -1, 2] / 1.3784049."""
    from unirl_core.algorithms.advantages import compute_advantages
    from unirl_core.algorithms.registry import algorithm_config
    from unirl_core.config import load_recipe
    from unirl_core.config.recipe import packaged_recipes

    by_hand = [-0.7254763, 0.0, 0.7254763, -0.7254763, -0.7254763, 1.4509525]
    env = {"DATA_PATH": "p.txt", "MODEL_PATH": "m", "CLIP_PATH": "c"}
    assert "sd35_medium_flow_dppo" in packaged_recipes()
    recipe = load_recipe("sd35_medium_flow_dppo", env=env).train.algorithm
    preset = algorithm_config({"name": "flow_dppo"})
    for algorithm in (recipe, preset):
        prompts = ["a"] * 3 + ["b"] * 3
        advantages, _ = compute_advantages(algorithm, None, prompts, [1, 2, 3, 2, 2, 5], 3)
        assert advantages.tolist() == pytest.approx(by_hand, abs=1e-6)
