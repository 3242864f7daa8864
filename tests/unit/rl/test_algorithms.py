"""The named algorithms' math against hand-derived cases and the reference code's own numbers, and the step plan
(which denoising steps are stochastic and trained) for each convention.

Reference numbers: flow_grpo (yifan123/flow_grpo @54809b5 sd3_sde_with_logprob.py, zhtmike/flow_grpo @2e2f712
train_sd3_GRPO_Guard.py), computed in float64 from their equations at SD3's 10-step schedule, step 4
(sigma 0.79037 -> 0.70728, inputs rounded to 5 digits: rtol 1e-4); UniRL (Tencent-Hunyuan/UniRL @0c97cfb
unirl/algorithms/flowdppo.py) for the divergence mask; DiffusionNFT (NVlabs/DiffusionNFT train_nft_sd3.py, read in
its verbatim fork pkuhxy/DiffusionNFT @619456a) transcribed in float64 for its loss, r and old-policy decay.
"""

from __future__ import annotations

import math

import pytest
import torch

from unirl_core.algorithms.advantages import compute_advantages
from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.algorithms.losses import (
    divergence_mask_loss,
    gaussian_kl,
    nft_loss,
    nft_preference,
    ppo_clip_loss,
    prediction_mse,
    ratio_norm_loss,
)
from unirl_core.algorithms.registry import algorithm_config
from unirl_core.config import RecipeError, recipe_from_tree
from unirl_core.config.schema import TrainConfig
from unirl_core.domains.diffusion.rollout.samplers import cps_step, flow_sde_step
from unirl_core.domains.diffusion.rollout.step_plan import plan_steps

SIGMA, SIGMA_NEXT, SIGMA_MAX = 0.79037, 0.70728, 0.96013
X = torch.tensor([[0.5, -1.0], [0.1, 0.2]], dtype=torch.float64)
V_OLD = torch.tensor([[0.2, 0.4], [-0.3, 0.1]], dtype=torch.float64)
V_NEW = V_OLD + torch.tensor([[0.01, -0.02], [0.0, 0.03]], dtype=torch.float64)
NOISE = torch.tensor([[0.3, -0.6], [1.0, -0.5]], dtype=torch.float64)
A = torch.tensor([1.2, -0.7], dtype=torch.float64)


def transitions(step=flow_sde_step, **kwargs):
    """pi_old's step with its drawn x_next (from NOISE), and both policies' re-evaluations of that transition."""
    old = step(V_OLD, X, SIGMA, SIGMA_NEXT, 0.7 if step is flow_sde_step else 0.8, **kwargs)
    x_next = (old.mean + old.std * NOISE).double()
    eta = 0.7 if step is flow_sde_step else 0.8
    old = step(V_OLD, X, SIGMA, SIGMA_NEXT, eta, prev_sample=x_next, **kwargs)
    new = step(V_NEW, X, SIGMA, SIGMA_NEXT, eta, prev_sample=x_next, **kwargs)
    return old, new, x_next


def algorithm(**keys) -> AlgorithmConfig:
    return algorithm_config(keys)


# --- the step plan ------------------------------------------------------------------------------------------------


def test_default_plan_is_the_first_fraction_of_the_steps_stochastic_and_trained():
    plan = plan_steps(algorithm(timestep_fraction=0.5), 0, 10, step=0, seed=0, sample_ids=["a", "b"])
    assert plan.sde == [0, 1, 2, 3, 4] and plan.trained_BJ.tolist() == [[0, 1, 2, 3, 4]] * 2


def test_trained_step_count_rounds_or_floors_as_the_references_do():
    """10 steps x 0.99: 10 trained with round (ours), 9 with int (flow_grpo, DDPO)."""
    assert len(plan_steps(algorithm(timestep_fraction=0.99), 0, 10, 0, 0, ["a"]).sde) == 10
    floored = plan_steps(algorithm(timestep_fraction=0.99, step_rounding="floor"), 0, 10, 0, 0, ["a"])
    assert floored.sde == list(range(9))


def test_untrained_steps_sde_samples_every_step_and_trains_the_first():
    """flow_grpo: every step is SDE (the last included), the first int(0.99 n) are trained."""
    plan = plan_steps(
        algorithm(timestep_fraction=0.99, step_rounding="floor", untrained_steps="sde"), 0, 10, 0, 0, ["a"]
    )
    assert plan.sde == list(range(10)) and plan.trained_BJ.tolist() == [list(range(9))]


def test_random_timesteps_are_a_subset_per_sample_independent_of_the_batch():
    """DDPO / DanceGRPO: each sample trains its own int(0.6 x 9) = 5 of the first 9 steps (the last excluded),
    drawn from (seed, sample id): the same whatever else is in the batch."""
    config = algorithm(name="dancegrpo")
    plan = plan_steps(config, 0, 10, step=3, seed=7, sample_ids=["s0", "s1", "s2", "s3"])
    assert plan.sde == list(range(9)) and plan.trained_BJ.shape == (4, 5)
    assert all(len(set(row)) == 5 and max(row) < 9 for row in plan.trained_BJ.tolist())
    assert len({tuple(row) for row in plan.trained_BJ.tolist()}) > 1  # samples differ
    alone = plan_steps(config, 0, 10, step=3, seed=7, sample_ids=["s2"])
    assert alone.trained_BJ.tolist() == plan.trained_BJ[2:3].tolist()


def test_sliding_window_moves_every_shift_and_cycles():
    """`tail: full`: windows of 2 over 6 candidate steps (the last excluded -> starts 0..3... with `end` empty: 0..4),
    moving 1 step every 2 RL steps and back to the start, always whole."""
    config = algorithm(name="mixgrpo", sde_window={"size": 2, "shift_every": 2, "tail": "full", "end": None})
    starts = [plan_steps(config, 0, 7, step, 0, ["a"]).sde[0] for step in range(12)]
    assert starts == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 0, 0]
    plan = plan_steps(config, 0, 7, 5, 0, ["a"])
    assert plan.sde == [2, 3] and plan.trained_BJ.tolist() == [[0, 1]]


# MixGRPO's GRPOTrainingStates (Tencent-Hunyuan/MixGRPO train_grpo_flux.py, 25 steps): max_timesteps = 25 - 2 = 23;
# at RL step k the window is range(p, min(p + 4, 23)) with p = (k // 25) mod 24 (p moves 1 every 25 steps and rolls
# back to 0 once past 23); worked by hand: p 0 -> 0-3, 19 -> 19-22, 20 -> 20-22, 22 -> 22, 23 -> nothing, 24 -> 0
MIXGRPO_WINDOWS = {0: [0, 1, 2, 3], 24: [0, 1, 2, 3], 25: [1, 2, 3, 4], 475: [19, 20, 21, 22], 499: [19, 20, 21, 22],
                   500: [20, 21, 22], 525: [21, 22], 550: [22], 575: [], 599: [], 600: [0, 1, 2, 3],
                   700: [4, 5, 6, 7]}  # fmt: skip


def test_mixgrpos_window_shrinks_at_n_minus_2_and_restarts_after_24_positions_as_its_code():
    config = algorithm(name="mixgrpo")
    windows = {step: plan_steps(config, 0, 25, step, 0, ["a"]).sde for step in range(701)}
    assert {step: windows[step] for step in MIXGRPO_WINDOWS} == MIXGRPO_WINDOWS
    by_hand = {k: list(range((k // 25) % 24, min((k // 25) % 24 + 4, 23))) for k in range(701)}
    assert windows == by_hand
    assert plan_steps(config, 0, 25, 575, 0, ["a", "b"]).trained_BJ.shape == (2, 0)  # the empty window trains nothing
    whole = algorithm(name="mixgrpo", sde_window={"tail": "full", "end": None})  # unirl before: always 4 steps, to n-2
    assert plan_steps(whole, 0, 25, 500, 0, ["a"]).sde == [20, 21, 22, 23]
    assert all(len(plan_steps(whole, 0, 25, k, 0, ["a"]).sde) == 4 for k in range(0, 701, 25))
    flash = algorithm(name="mixgrpo_flash")  # moves every 20: the first shrunk window at RL step 400
    assert plan_steps(flash, 0, 25, 399, 0, ["a"]).sde == [19, 20, 21, 22]
    assert plan_steps(flash, 0, 25, 400, 0, ["a"]).sde == [20, 21, 22]


def test_random_window_is_a_function_of_the_rl_step():
    """Flow-GRPO-Fast: a 2-step window whose start is uniform in [0, n - 2], drawn from (seed, step), so a
    resumed run draws the uninterrupted run's windows; ODE elsewhere."""
    config = algorithm(name="flow_grpo_fast")
    starts = [plan_steps(config, 0, 10, step, 5, ["a"]).sde[0] for step in range(40)]
    assert set(starts) == set(range(9))
    assert starts == [plan_steps(config, 0, 10, step, 5, ["b"]).sde[0] for step in range(40)]


def test_subset_window_draws_distinct_steps_of_the_first_half():
    """FlowDPPO: 3 distinct steps of int(10 x 0.5) = the first 5, per RL step."""
    config = algorithm(name="flow_dppo")
    plans = [plan_steps(config, 0, 10, step, 0, ["a"]).sde for step in range(30)]
    assert all(len(set(p)) == 3 and p == sorted(p) and max(p) < 5 for p in plans)
    assert len({tuple(p) for p in plans}) > 3


def test_cps_never_trains_the_last_step():
    plan = plan_steps(algorithm(sde_type="cps", untrained_steps="sde"), 0, 10, 0, 0, ["a"])
    assert plan.sde == list(range(9))


def test_an_image_to_image_rollout_plans_from_its_first_step():
    plan = plan_steps(algorithm(timestep_fraction=0.5), 4, 10, 0, 0, ["a"])
    assert plan.sde == [4, 5, 6]


# --- presets and validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("flow_grpo_fast", {"sde_window.mode": "random", "sde_window.size": 2}),
        ("mixgrpo", {"sde_window.mode": "sliding", "sde_window.size": 4, "sde_window.shift_every": 25}),
        (
            "dancegrpo",
            {"sde_type": "dance", "eta": 0.3, "train_timesteps": "random", "timestep_fraction": 0.6, "std_ddof": 1},
        ),
        ("grpo_guard", {"clip_range": 2e-6, "step_rounding": "floor", "untrained_steps": "sde"}),
        ("flow_dppo", {"sde_window.mode": "subset", "kl_threshold": 1e-5, "num_updates_per_batch": 2}),
        (
            "diffusion_nft",
            {
                "nft_beta": 1.0,
                "beta": 1e-4,
                "group_by": "prompt",
                "std_mode": "batch",
                "timestep_fraction": 0.99,
                "step_rounding": "floor",
                "train_timesteps": "random",
                "old_decay_rate": 0.001,
                "old_decay_max": 0.5,
            },
        ),
    ],
)
def test_a_named_algorithm_fills_its_papers_defaults(name, expected):
    config = algorithm(name=name)
    for dotted, value in expected.items():
        node = config
        for part in dotted.split("."):
            node = getattr(node, part)
        assert node == value, dotted


def test_recipe_keys_win_over_a_preset_and_groups_share_noise_unless_told():
    config = TrainConfig.model_validate({"algorithm": {"name": "mixgrpo", "sde_window": {"size": 2}, "eta": 0.5}})
    assert config.algorithm.sde_window.size == 2 and config.algorithm.sde_window.mode == "sliding"
    assert config.algorithm.eta == 0.5 and config.sampling.share_group_noise
    mine = TrainConfig.model_validate({"algorithm": {"name": "dancegrpo"}, "sampling": {"share_group_noise": False}})
    assert not mine.sampling.share_group_noise
    assert not TrainConfig.model_validate({"algorithm": {"name": "grpo"}}).sampling.share_group_noise


def test_a_window_that_does_not_fit_is_refused_with_the_arithmetic():
    expected = r"sde_window.size: got 4; at most end - start = 2 - 0 = 2 \(the window must fit in steps \[0, 2\) of 4"
    algorithm = {"name": "mixgrpo", "sde_window": {"tail": "full"}}
    with pytest.raises(RecipeError, match=expected):
        recipe_from_tree({"train": {"sampling": {"num_inference_steps": 4}, "algorithm": algorithm}})
    shrinking = {"name": "mixgrpo", "sde_window": {"start": 2}}  # a shrinking window needs a first step before end
    with pytest.raises(RecipeError, match=r"sde_window.start: got 2; below the windows' end 2 of 4 steps"):
        recipe_from_tree({"train": {"sampling": {"num_inference_steps": 4}, "algorithm": shrinking}})


# --- samplers -----------------------------------------------------------------------------------------------------


def test_cps_preserves_the_noise_level_and_its_eta_zero_is_euler():
    """With the exact velocity v = noise - x0 at x = (1 - s) x0 + s noise, the CPS mean keeps (1 - s') of x0 and
    sqrt(s'^2 - std^2) of the noise, so with the fresh noise the sample's noise variance is exactly s'^2."""
    x0, noise = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    x = (1 - SIGMA) * x0 + SIGMA * noise
    result = cps_step(noise - x0, x, SIGMA, SIGMA_NEXT, 0.8)
    std = SIGMA_NEXT * math.sin(0.8 * math.pi / 2)
    assert math.isclose(result.std.item(), std, rel_tol=1e-6)
    kept = math.sqrt(SIGMA_NEXT**2 - std**2)
    assert torch.allclose(result.mean.double(), (1 - SIGMA_NEXT) * x0 + kept * noise, atol=1e-6)
    assert math.isclose(kept**2 + std**2, SIGMA_NEXT**2, rel_tol=1e-9)
    euler = cps_step(V_OLD, X, SIGMA, SIGMA_NEXT, 0.0)
    assert euler.log_prob is None and torch.allclose(euler.mean.double(), X + V_OLD * (SIGMA_NEXT - SIGMA))


def test_cps_matches_flow_grpos_mean_and_std():
    old, _, _ = transitions(cps_step)
    assert math.isclose(old.std.item(), 0.67266325285, rel_tol=1e-4)
    expected = torch.tensor([[0.21853275973, -0.58549756011], [0.10679016922, 0.08370230287]], dtype=torch.float64)
    assert torch.allclose(old.mean.double(), expected, rtol=1e-4)


def test_dance_sde_has_std_eta_sqrt_dt():
    result = flow_sde_step(V_OLD, X, SIGMA, SIGMA_NEXT, 0.3, constant_std=True)
    assert math.isclose(result.std.item(), 0.3 * math.sqrt(SIGMA - SIGMA_NEXT), rel_tol=1e-6)
    dt = SIGMA_NEXT - SIGMA  # DanceGRPO: x + dt [v + eta^2 / (2 sigma) (x + (1 - sigma) v)]
    expected = X + dt * (V_OLD + 0.3**2 / (2 * SIGMA) * (X + (1 - SIGMA) * V_OLD))
    assert torch.allclose(result.mean.double(), expected, atol=1e-7)


# --- losses -------------------------------------------------------------------------------------------------------


def test_grpo_loss_and_kl_forms_match_flow_grpos_numbers():
    old, new, _ = transitions(sigma_max=SIGMA_MAX)
    assert math.isclose(old.std.item(), 0.3917968374, rel_tol=1e-4)
    terms, _ = ppo_clip_loss(new.log_prob, old.log_prob, A, 1e-4)
    assert math.isclose(terms.mean().item(), -0.24811954089, rel_tol=1e-4)
    exact = gaussian_kl(new.mean, old.mean, new.std)
    flow_grpo = exact * abs(new.dt)  # `kl_form: flow_grpo`
    assert torch.allclose(flow_grpo.double(), torch.tensor([7.2405764e-07, 1.30330375e-06]).double(), rtol=1e-3)
    std_dev_t = 0.7 * math.sqrt(SIGMA / (1 - SIGMA))  # flow_grpo divides by 2 std_dev_t^2: no sqrt(|dt|)
    by_hand = ((new.mean - old.mean) ** 2).mean(dim=1) / (2 * std_dev_t**2)
    assert torch.allclose(flow_grpo.double(), by_hand.double(), rtol=1e-5)


def test_ratio_norm_is_the_noise_projection_of_the_mean_shift_and_reweights_by_dt():
    """GRPO-Guard with `ratio_norm_bias: sample`: log r = mean(eps (mu - mu_old)), eps = (x_next - mu_old) / s; the loss divided by |dt|."""
    old, new, x_next = transitions(sigma_max=SIGMA_MAX)
    terms, metrics = ratio_norm_loss(new, old.log_prob, old.mean, A, 2e-6, bias="sample")
    eps = (x_next - old.mean) / old.std
    log_ratio = (eps * (new.mean - old.mean)).mean(dim=1)
    assert torch.allclose(torch.tensor([metrics["ratio_min"], metrics["ratio_max"]]).double(),
                          log_ratio.exp().sort().values.double(), rtol=1e-6)  # fmt: skip
    assert torch.allclose(log_ratio.double(), torch.tensor([-7.75852875e-04, 7.75852875e-04]).double(), rtol=1e-3)
    assert math.isclose(terms.mean().item(), -2.99991593379, rel_tol=2e-3)  # flow_grpo's, through rounded sigmas
    by_hand = torch.maximum(-A * log_ratio.exp(), -A * log_ratio.exp().clamp(1 - 2e-6, 1 + 2e-6)) / abs(new.dt)
    assert torch.allclose(terms.double(), by_hand.double(), rtol=1e-5)


@pytest.mark.parametrize(
    ("bias", "log_ratio", "clipped"),
    [("batch", [0.025, -0.01], 2), ("sample", [0.005, 0.01], 1)],  # by hand below
)
def test_ratio_norm_bias_is_one_per_step_over_the_micro_batch_as_flow_grpos_guard(bias, log_ratio, clipped):
    """flow_grpo's train_sd3_GRPO_Guard.py averages mean(dmu^2) / (2 s^2) over the whole micro-batch (`dim=()` on a
    1-D log-prob): s = 0.5, dmu = [0.1, 0.1] and [0.3, -0.1] give 0.02 and 0.1 per sample, 0.06 for the batch;
    logp - logp_old = [-0.01, -0.08]; log r = (logp - logp_old + b) s: batch [0.025, -0.01], sample [0.005, 0.01]."""
    mean_new = torch.tensor([[0.1, 0.1], [0.3, -0.1]], requires_grad=True)
    result = type("R", (), {"log_prob": torch.tensor([-0.01, -0.08]), "mean": mean_new, "std": torch.tensor(0.5),
                            "dt": -0.1})()  # fmt: skip
    advantages = torch.tensor([1.0, 1.0])
    terms, metrics = ratio_norm_loss(result, torch.zeros(2), torch.zeros(2, 2), advantages, 0.008, bias=bias)
    ratio = torch.tensor(log_ratio).exp()
    assert torch.allclose(torch.tensor([metrics["ratio_min"], metrics["ratio_max"]]), ratio.sort().values, rtol=1e-6)
    assert metrics["clip_fraction"].item() == clipped / 2
    by_hand = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - 0.008, 1 + 0.008)) / 0.1
    assert torch.allclose(terms.detach(), by_hand, rtol=1e-6)
    unclipped, _ = ratio_norm_loss(result, torch.zeros(2), torch.zeros(2, 2), advantages, 1.0, bias=bias)
    (grad,) = torch.autograd.grad(unclipped[0], mean_new)
    assert (grad[1].abs().sum().item() > 0) == (bias == "batch")  # sample 0's term moves with sample 1's mean


def test_divergence_mask_drops_only_high_kl_moves_along_the_advantage():
    """FlowDPPO: four (ratio, A) cases at a KL above the threshold, and the same at one below it."""
    std = torch.tensor(0.5)
    result_mean = torch.tensor([[0.1], [0.1], [0.1], [0.1]])
    logp_new = torch.tensor([0.02, -0.02, 0.02, -0.02], requires_grad=True)
    result = type("R", (), {"log_prob": logp_new, "mean": result_mean, "std": std, "dt": -0.1})()
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0])  # along, along, corrective, corrective
    far = torch.zeros(4, 1)  # KL = 0.1^2 / (2 0.25) = 0.02
    terms, metrics = divergence_mask_loss(result, torch.zeros(4), far, advantages, kl_threshold=1e-5)
    ratio = logp_new.detach().exp()
    assert torch.allclose(terms.detach(), torch.tensor([0.0, 0.0, ratio[2], -ratio[3]]))
    assert metrics["masked_fraction"] == 0.5 and math.isclose(metrics["kl_old_mean"].item(), 0.02, rel_tol=1e-5)
    terms.mean().backward()
    assert logp_new.grad[0] == 0 and logp_new.grad[1] == 0 and logp_new.grad[2] != 0
    near = result_mean.clone()  # KL 0: nothing dropped, plain -A ratio
    terms, metrics = divergence_mask_loss(result, torch.zeros(4), near, advantages, kl_threshold=1e-5)
    assert torch.allclose(terms.detach(), -advantages * ratio) and metrics["masked_fraction"] == 0


def test_flow_dppos_kl_at_sigma_one_uses_the_transitions_own_std_as_unirl_now_does():
    """UniRL's FlowDPPO `_compute_sigma_t` (Tencent-Hunyuan/UniRL 1cc88b6, flowdppo.py) takes sigma_max = sigmas[1]
    in place of sigma = 1, "not a 0.99 clamp, so sigma_t equals the transition's std_var"; its earlier versions
    clamped sigma at 0.99. By hand, 10 steps shifted by 3: sigma_1 = 2.7 / 2.8, eta 0.7: std = 0.7 sqrt(1 / (1 -
    sigma_1)) sqrt(sigma_0 - sigma_1) = 0.7 exactly (0.99 clamp: 7 sqrt(1/28) = 1.3228757, KL 3.57x smaller)."""
    sigma_1 = 2.7 / 2.8
    x, v = torch.zeros(2, 3), torch.ones(2, 3)
    old = flow_sde_step(v, x, 1.0, sigma_1, 0.7, sigma_max=sigma_1)
    assert math.isclose(old.std.item(), 0.7, rel_tol=1e-6)
    mean_old = old.mean - torch.tensor([[0.01], [0.0]])  # sample 0 moved by 0.01 per element
    result = type("R", (), {"log_prob": torch.zeros(2), "mean": old.mean, "std": old.std, "dt": old.dt})()
    _, metrics = divergence_mask_loss(result, torch.zeros(2), mean_old, torch.ones(2), kl_threshold=1e-5)
    assert math.isclose(metrics["kl_old_max"].item(), 0.01**2 / (2 * 0.49), rel_tol=1e-4)


# --- advantages ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("std_mode", "expected"),
    [
        ("group", [-1.068959, 0.0, -0.267240, 0.0, 1.336199, 0.0]),
        ("batch", [-1.048112, 0.0, -0.262028, 0.0, 1.310141, 0.0]),
    ],
)
def test_grouping_by_prompt_text_matches_flow_grpos_tracker(std_mode, expected):
    """flow_grpo groups by prompt text: 'a' three times and 'b' three times, wherever they sit in the batch."""
    config = algorithm(group_by="prompt", std_mode=std_mode)
    prompts = ["a", "b", "a", "b", "a", "b"]
    advantages, _ = compute_advantages(config, None, prompts, [1.0, 0.5, 2.0, 0.5, 4.0, 0.5], group=2)
    assert torch.allclose(advantages, torch.tensor(expected), atol=1e-5)
    by_position, _ = compute_advantages(algorithm(std_mode=std_mode), None, prompts, [1, 0.5, 2, 0.5, 4, 0.5], 2)
    assert not torch.allclose(by_position, advantages)


# DiffusionNFT's worked case: two samples of shape [1, 1, 2] at t = 0.5 and 0.25 (the grid sigma), fresh noise
NFT_X0 = torch.tensor([[[[0.5, -1.0]]], [[[1.0, 0.0]]]], dtype=torch.float64)
NFT_NOISE = torch.tensor([[[[1.0, 0.0]]], [[[-1.0, 2.0]]]], dtype=torch.float64)
NFT_T = torch.tensor([0.5, 0.25], dtype=torch.float64).view(2, 1, 1, 1)
NFT_V_OLD = torch.tensor([[[[0.4, 1.2]]], [[[-1.5, 1.8]]]], dtype=torch.float64)
NFT_V_NEW = torch.tensor([[[[0.6, 0.9]]], [[[-2.0, 2.1]]]], dtype=torch.float64)
NFT_V_REF = torch.tensor([[[[0.5, 1.0]]], [[[-1.8, 2.0]]]], dtype=torch.float64)


def nft_case(v_new, nft_beta, kl_beta=1e-4):
    """The reference's total loss (5 x mean of the policy terms + kl_beta x velocity MSE) from velocities, through
    x0 predictions x_t - t v as our stack feeds them; r from rewards [1.0, 0.0] of prompt 'a', [0.5, 0.7] of 'b'."""
    config = algorithm(name="diffusion_nft")
    advantages, _ = compute_advantages(config, None, ["a", "a", "b", "b"], [1.0, 0.0, 0.5, 0.7], group=2)
    r = nft_preference(advantages, config.adv_clip)
    x_t = (1 - NFT_T) * NFT_X0 + NFT_T * NFT_NOISE
    terms, _ = nft_loss(x_t - NFT_T * v_new, x_t - NFT_T * NFT_V_OLD, NFT_X0, r[:2].double(), nft_beta, 5.0)
    return r, terms.double().mean() + kl_beta * prediction_mse(v_new, NFT_V_REF).mean()


def test_nft_preference_is_half_plus_the_clipped_batch_normalized_advantage_over_ten():
    r, _ = nft_case(NFT_V_NEW, 1.0)
    assert torch.allclose(r, torch.tensor([0.637323, 0.362677, 0.472535, 0.527465]), atol=1e-6)
    assert nft_preference(torch.tensor([-9.0, 0.0, 9.0]), 5.0).tolist() == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("nft_beta", "loss", "grad"),
    [
        (1.0, 0.6269456, [1.136668, -1.363342, -0.531112, 0.718903]),
        (0.1, 4.6575402, [-0.198987, 0.487617, -0.232711, 0.110611]),
    ],
)
def test_nft_loss_matches_the_reference_transcription(nft_beta, loss, grad):
    """Adaptive x0 weights per term, 5 x (r pos + (1 - r) neg) / beta, + 1e-4 x the velocity MSE to the base."""
    v_new = NFT_V_NEW.clone().requires_grad_(True)
    _, total = nft_case(v_new, nft_beta)
    total.backward()
    assert total.item() == pytest.approx(loss, rel=5e-7)  # r is float32, as our advantages are
    assert torch.allclose(v_new.grad.flatten(), torch.tensor(grad, dtype=torch.float64), atol=2e-6)


def test_nft_gradient_at_the_old_policy_does_not_depend_on_beta():
    """At v = v_old the loss scales as 1/beta but its gradient is 2 (2r - 1)(v_old - v) x scale, for every beta."""
    grads, totals = [], []
    for nft_beta in (1.0, 0.1):
        v_new = NFT_V_OLD.clone().requires_grad_(True)
        _, total = nft_case(v_new, nft_beta, kl_beta=0.0)
        total.backward()
        grads.append(v_new.grad.flatten())
        totals.append(total.item())
    assert totals == pytest.approx([0.4672619, 4.6726190], abs=1e-6)
    assert torch.allclose(grads[0], grads[1], atol=1e-9)
    assert torch.allclose(grads[0], torch.tensor([-0.228871, 0.457743, -0.245219, 0.098088], dtype=torch.float64),
                          atol=2e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "updates", "expected"),
    [
        ({}, [1, 100, 500, 1000], [0.001, 0.1, 0.5, 0.5]),  # decay_type 1
        ({"old_decay_rate": 0.0075, "old_decay_start": 75, "old_decay_max": 0.999},  # decay_type 2 (OCR)
         [74, 75, 100, 208, 300], [0.0, 0.0, 0.1875, 0.9975, 0.999]),
    ],
)  # fmt: skip
def test_old_policy_decay_follows_the_references_schedules(keys, updates, expected):
    from unirl_core.algorithms.diffusion_nft import old_policy_decay

    config = algorithm(name="diffusion_nft", **keys)
    assert [old_policy_decay(config, n) for n in updates] == pytest.approx(expected)


def test_every_sampler_reports_the_clean_latent_it_predicts():
    """DiffusionNFT trains on x0 predictions: x - sigma v for flow steps (SDE, CPS, ODE), the DDIM x0 for DDIM."""
    for eta in (0.0, 0.7):
        result = flow_sde_step(V_OLD, X, SIGMA, SIGMA_NEXT, eta, sigma_max=SIGMA_MAX)
        assert torch.allclose(result.x0, (X - SIGMA * V_OLD).float()) and torch.equal(result.prediction, V_OLD.float())
    assert torch.allclose(cps_step(V_OLD, X, SIGMA, SIGMA_NEXT, 0.8).x0, (X - SIGMA * V_OLD).float())
    from unirl_core.domains.diffusion.rollout.samplers import ddim_step

    result = ddim_step(V_OLD, X, 0.3, 0.5, 0.0)
    assert torch.allclose(result.x0, ((X - math.sqrt(0.7) * V_OLD) / math.sqrt(0.3)).float())


def test_dancegrpos_advantages_use_the_n_minus_1_std_plus_1e_8():
    """DanceGRPO and MixGRPO normalize by torch's .std() (N - 1) + 1e-8: rewards [1, 2, 3, 4] of one group give
    [-1.161895, -0.387298, 0.387298, 1.161895] (the population std would give +-1.341641, +-0.447214)."""
    for name in ("dancegrpo", "mixgrpo"):
        advantages, _ = compute_advantages(algorithm(name=name), None, ["a"] * 4, [1.0, 2.0, 3.0, 4.0], group=4)
        assert torch.allclose(advantages, torch.tensor([-1.161895, -0.387298, 0.387298, 1.161895]), atol=1e-6)
    population, _ = compute_advantages(algorithm(), None, ["a"] * 4, [1.0, 2.0, 3.0, 4.0], group=4)
    assert torch.allclose(population, torch.tensor([-1.341521, -0.447174, 0.447174, 1.341521]), atol=1e-6)  # eps 1e-4


def test_the_advantage_conventions_are_settable_from_the_command_line():
    """`--set train.algorithm.std_ddof=1` arrives as the string '1' (as every scalar override does)."""
    smoke = {"train": {"data": {"source": "smoke"}}}
    config = recipe_from_tree(smoke, ["train.algorithm.std_ddof=1", "train.algorithm.adv_eps=1e-8"]).train.algorithm
    assert config.std_ddof == 1 and config.adv_eps == 1e-8
    with pytest.raises(RecipeError, match="train.algorithm.std_ddof: got '2'"):
        recipe_from_tree(smoke, ["train.algorithm.std_ddof=2"])
