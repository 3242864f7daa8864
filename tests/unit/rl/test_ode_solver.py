"""DPM-Solver++ 2M on the rollout's deterministic steps (`algorithm.ode_solver: dpm2m`) and MixGRPO-Flash's thinned
ODE steps after the window (`sde_window.post_compress`).

The solver is checked against diffusers' own DPMSolverMultistepScheduler (dpmsolver++, order 2, midpoint, final
sigma 0) on a smooth stand-in model in float64, in both parametrizations: flow matching (SD3's shifted sigmas,
`flow_prediction`) and DDIM's epsilon prediction. Which steps it corrects follows the references' code:
DiffusionNFT's `dpm2` (pkuhxy/DiffusionNFT @619456a config/nft.py, flow_grpo @54809b5 solver.py: first and last
steps first order) and MixGRPO-Flash (zqqqqz2000/MixGRPO @75c797f sampling_utils.py: Euler up to the window's end,
2M after it with the window's x0 predictions as history; `dpm_post_compress_ratio` 0.4 over int((n - last) x 0.4)
grid points).
"""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler, DPMSolverMultistepScheduler

from unirl_core.algorithms.registry import algorithm_config
from unirl_core.domains.diffusion.rollout.ode import OdeSteps
from unirl_core.domains.diffusion.rollout.samplers import ddim_step, flow_sde_step
from unirl_core.domains.diffusion.rollout.step_plan import StepPlan, compressed_schedule, plan_steps

X_START = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def velocity(x, sigma):  # a smooth stand-in for a model (float64)
    return torch.tanh(x) * (1 + sigma) - 0.3 * sigma


def epsilon(x, t):
    return torch.tanh(x) * (1 + t / 1000) - 0.1


def flow_run(sigmas, solver, first_multistep=0):
    x, ode = X_START.clone(), OdeSteps(solver, lambda i: (1 - sigmas[i], sigmas[i]), len(sigmas) - 1, first_multistep)
    for i in range(len(sigmas) - 1):
        x = ode(i, flow_sde_step(velocity(x, sigmas[i]), x, sigmas[i], sigmas[i + 1], 0.0)).double()
    return x


def sd3_sigmas(n, shift=3.0):
    t = torch.linspace(1, 1 / n, n, dtype=torch.float64)
    return [float(s) for s in shift * t / (1 + (shift - 1) * t)] + [0.0]


def test_dpm2m_on_a_flow_schedule_is_diffusers_dpm_solver():
    scheduler = DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0)
    scheduler.set_timesteps(8)
    sigmas = [float(s) for s in scheduler.sigmas]
    x = X_START.clone()
    for i, t in enumerate(scheduler.timesteps):
        x = scheduler.step(velocity(x, sigmas[i]), t, x).prev_sample
    ours = flow_run(sigmas, "dpm2m")
    assert torch.allclose(ours, x, atol=2e-6)
    assert (flow_run(sigmas, "euler") - x).abs().max() > 0.02  # the check can tell the solvers apart


def test_dpm2m_on_a_ddim_schedule_is_diffusers_dpm_solver():
    betas = {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012}
    ddim = DDIMScheduler(**betas, set_alpha_to_one=True, steps_offset=1)
    ddim.set_timesteps(8)
    timesteps = [int(t) for t in ddim.timesteps]
    scheduler = DPMSolverMultistepScheduler(**betas)
    scheduler.set_timesteps(timesteps=timesteps)
    x = X_START.clone()
    for t in scheduler.timesteps:
        x = scheduler.step(epsilon(x, int(t)), t, x).prev_sample
    bars = [ddim.alphas_cumprod[t].item() for t in timesteps] + [1.0]  # then the clean latent
    ours, ode = X_START.clone(), OdeSteps("dpm2m", lambda i: (bars[i] ** 0.5, (1 - bars[i]) ** 0.5), 8)
    for i, t in enumerate(timesteps):
        ours = ode(i, ddim_step(epsilon(ours, t), ours, bars[i], bars[i + 1], 0.0)).double()
    assert torch.allclose(ours, x, atol=2e-5)


def test_dpm2m_is_an_order_more_accurate_than_euler_on_a_smooth_model():
    """Against a 20000-step Euler solution: at 16 and 32 steps DPM-Solver++ 2M is 9-10x closer than Euler (on the
    tiny random models, whose velocity is not smooth in sigma, it is not: their rollouts only check the wiring)."""
    sigmas, x = sd3_sigmas(20000), X_START.clone()
    for i in range(20000):
        x = x + velocity(x, sigmas[i]) * (sigmas[i + 1] - sigmas[i])
    for n in (16, 32):
        euler, dpm = (float((flow_run(sd3_sigmas(n), s) - x).pow(2).mean().sqrt()) for s in ("euler", "dpm2m"))
        assert dpm < euler / 8, (n, euler, dpm)


def test_dpm2m_keeps_the_steps_before_first_multistep_and_carries_their_history():
    """MixGRPO-Flash: steps up to the window's end are the family's own; the first step after it is second order
    from the window's last x0 prediction; the last step is first order (lambda is infinite at sigma 0)."""
    sigmas = sd3_sigmas(8)
    x, euler, flash = (
        X_START.clone(),
        OdeSteps("euler", None, 8),
        OdeSteps("dpm2m", lambda i: (1 - sigmas[i], sigmas[i]), 8, 4),
    )
    for i in range(8):
        result = flow_sde_step(velocity(x, sigmas[i]), x, sigmas[i], sigmas[i + 1], 0.0)
        ours = flash(i, result, stochastic=i in (2, 3))
        assert torch.equal(ours, euler(i, result)) == (i < 4 or i == 7), i
        x = result.sample.double()
    assert flash.history[0] == 7


def test_post_compress_thins_the_steps_after_the_window_to_mixgrpo_flashs_count():
    """25 steps, window 0-3 (last index 3): int((25 - 3) x 0.4) = 8 points from step 4 to 25, 7 steps of 3; the
    window's steps and noise levels are kept (`post_spacing: grid`: grid points by index)."""
    config = algorithm_config({"name": "mixgrpo_flash", "sde_window": {"post_spacing": "grid"}})
    assert (
        config.sde_window.post_compress == 0.4 and config.ode_solver == "dpm2m" and config.sde_window.shift_every == 20
    )
    schedule = list(range(26))  # stand-in noise levels: their grid indices
    plan = plan_steps(config, 0, 25, step=0, seed=0, sample_ids=["a"])
    assert plan.sde == [0, 1, 2, 3]
    assert compressed_schedule(config, schedule, plan) == [0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25]
    half = algorithm_config({"name": "mixgrpo_flash", "sde_window": {"post_compress": 0.2, "post_spacing": "grid"}})
    assert compressed_schedule(half, schedule, plan) == [0, 1, 2, 3, 4, 11, 18, 25]  # int(22 x 0.2) = 4 points
    late = StepPlan([20, 21, 22, 23], plan.trained_BJ)  # one step left: nothing to thin
    assert compressed_schedule(config, schedule, late) == schedule
    assert compressed_schedule(algorithm_config({"name": "mixgrpo"}), schedule, plan) == schedule


# MixGRPO-Flash's run_sample_step, worked by hand for 25 steps shifted by 3 (sigma = 3t / (1 + 2t), t = 1 - i / 25)
# and the window 1-4: post_time_step = 1 - 5/25 = 0.8, int((25 - 4) x 0.4) = 8 points linspace(0.8, 0, 8), shifted
FLASH_SIGMAS = [0.923077, 0.867470, 0.8, 0.716418, 0.610169, 0.470588, 0.279070, 0.0]


def test_post_compress_spaces_the_thinned_steps_evenly_in_time_as_mixgrpo_flash():
    config = algorithm_config({"name": "mixgrpo_flash"})
    assert config.sde_window.post_spacing == "time"
    grid = [3 * (1 - i / 25) / (1 + 2 * (1 - i / 25)) for i in range(26)]
    plan = StepPlan([1, 2, 3, 4], torch.zeros(1, 4, dtype=torch.long))
    ours = compressed_schedule(config, grid, plan)
    assert ours[:5] == grid[:5] and len(ours) == 5 + 8  # 12 steps instead of 25
    assert ours[5:] == pytest.approx(FLASH_SIGMAS, abs=1e-6)
    grid_config = algorithm_config({"name": "mixgrpo_flash", "sde_window": {"post_spacing": "grid"}})
    on_grid = compressed_schedule(grid_config, grid, plan)
    assert on_grid[5:] == [grid[i] for i in (5, 8, 11, 14, 16, 19, 22, 25)]
    assert max(abs(a - b) for a, b in zip(ours, on_grid, strict=True)) > 0.01  # off the grid


@pytest.mark.parametrize("name", ["diffusion_nft", "mixgrpo_flash"])
def test_the_algorithms_whose_references_roll_out_with_dpm_solver_default_to_it(name):
    assert algorithm_config({"name": name}).ode_solver == "dpm2m"
    assert algorithm_config({"name": "mixgrpo"}).ode_solver == "euler"


def test_a_family_stepping_off_the_schedule_refuses_post_compress():
    from types import SimpleNamespace

    from unirl_core.errors import UserError
    from unirl_core.models.families.sdxl.family import SDXLFamily
    from unirl_core.models.family import Family

    sdxl = SimpleNamespace(name="sdxl", sampler=SDXLFamily.sampler, sampler_kind=SDXLFamily.sampler_kind,
                           schedule_indexed=SDXLFamily.schedule_indexed)  # fmt: skip
    config = algorithm_config({"name": "mixgrpo_flash"})
    with pytest.raises(UserError, match="sde_window.post_compress: family 'sdxl'"):
        Family.step_sampling(sdxl, config)
