"""Which denoising steps of a rollout are stochastic (SDE, log-prob stored) and which of those each sample trains.

    candidates   the steps [first, n) of the rollout (the last one left out with `exclude_last_step` or `cps`), or
                 the `sde_window`'s steps at this RL step
    J            round(|candidates| x timestep_fraction) or int(...) (`step_rounding`), at least 1
    trained      the first J candidates for every sample (`first`), or J of them per sample (`random`: drawn from
                 (seed, step, sample id), so a sample trains the same steps on any number of ranks)
    sde          the steps that sample with eta > 0: the trained ones with `untrained_steps: ode` and `first`,
                 every candidate otherwise; all other steps are ODE steps (eta 0)

Windows (`algorithm.sde_window`) move with the RL step only: `fixed`, `random` (Flow-GRPO-Fast: one draw per RL
step from (seed, step)), `sliding` (MixGRPO: `stride` steps every `shift_every` RL steps, cycling; the last
windows shrink as in its code, or stay whole with `tail: full`), `subset`
(FlowDPPO: `size` distinct steps of the range per RL step); `post_compress` thins the ODE steps after the window
(`compressed_schedule`, MixGRPO-Flash). The plan is a
pure function of (config, RL step, sample ids), so a resumed run is on the same window as the uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from unirl_core.data.noise import sample_seed


@dataclass(frozen=True)
class StepPlan:
    sde: list[int]  # denoising steps run with eta > 0 (their transitions are stored), ascending
    trained_BJ: torch.Tensor  # [B, J] int64: positions in `sde` of the steps each sample trains


def last_candidate(algorithm, num_steps: int) -> int:
    """One past the last step that may be stochastic: the last step is left out with `exclude_last_step` and
    with a sampler that puts no noise on the step to the last level (CPS: `noise_at_last_step`)."""
    from unirl_core.domains.diffusion.rollout.samplers.registry import sampler_classes

    noisy_last = all(cls.noise_at_last_step for cls in sampler_classes(algorithm.sde_type))
    return num_steps - 1 if algorithm.exclude_last_step or not noisy_last else num_steps


def window_end(algorithm, num_steps: int) -> int:
    """Where SDE windows must end (exclusive): `end`, int(n x `end_fraction`), or the last candidate step."""
    window, limit = algorithm.sde_window, last_candidate(algorithm, num_steps)
    if window.end is not None and window.end < 0:  # counted back from the last candidate, as in a Python slice
        return limit + window.end
    if window.end is not None:
        return min(window.end, limit) if window.end <= num_steps else window.end
    if window.end_fraction is not None:
        return min(int(num_steps * window.end_fraction), limit)
    return limit


def window_steps(algorithm, first: int, num_steps: int, step: int, seed: int) -> list[int]:
    """The SDE window's steps at RL step `step` (steps before `first` never run: image-to-image)."""
    window = algorithm.sde_window
    low = max(window.start, first)
    end = window_end(algorithm, num_steps)
    high = end - window.size  # the last allowed start
    if window.mode == "sliding" and window.tail == "shrink" and end > low:
        return _shrinking_window(window, low, end, step)
    if high < low:
        raise ValueError(
            f"the SDE window of {window.size} steps does not fit in steps [{low}, {high + window.size}) "
            f"of {num_steps}: lower algorithm.sde_window.size or widen start/end"
        )
    generator = torch.Generator().manual_seed(sample_seed(seed, f"sde-window:{step}"))
    if window.mode == "fixed":
        begin = low
    elif window.mode == "random":
        begin = low + int(torch.randint(high - low + 1, (1,), generator=generator))
    elif window.mode == "sliding":  # low, low + stride, ..., then back to low
        positions = (high - low) // window.stride + 1
        begin = low + window.stride * ((step // window.shift_every) % positions)
    else:  # subset: `size` distinct steps of [low, end)
        chosen = torch.randperm(end - low, generator=generator)[: window.size].sort().values
        return [low + int(i) for i in chosen]
    return list(range(begin, begin + window.size))


def _shrinking_window(window, low: int, end: int, step: int) -> list[int]:
    """MixGRPO's progressive window (`GRPOTrainingStates` with `prog_overlap`, `roll_back`): it starts at `low`,
    moves `stride` steps every `shift_every` RL steps up to and including `end`, cut at `end` (the last windows
    shrink, down to an empty one at `end`: that RL step trains nothing), then starts again at `low`."""
    positions = (end - low) // window.stride + 1
    begin = low + window.stride * ((step // window.shift_every) % positions)
    return list(range(begin, min(begin + window.size, end)))


def trained_count(candidates: int, fraction: float, rounding: str) -> int:
    exact = candidates * fraction
    return max(1, min(candidates, round(exact) if rounding == "round" else math.floor(exact + 1e-9)))


def plan_steps(
    algorithm, first: int, num_steps: int, step: int, seed: int, sample_ids: list[str], trains=None
) -> StepPlan:
    """The plan of one rollout of denoising steps [first, num_steps) at RL step `step` (`seed`: the rollout's).
    `trains(index)`: whether step `index`'s denoiser trains (a frozen Wan 2.2 expert's steps are no candidates)."""
    if algorithm.sde_window is None:
        candidates = list(range(first, last_candidate(algorithm, num_steps)))
    else:
        candidates = window_steps(algorithm, first, num_steps, step, seed)
    candidates = [index for index in candidates if trains is None or trains(index)]
    if not candidates and algorithm.sde_window is not None:  # a shrinking window's empty end: nothing to train
        return StepPlan([], torch.zeros(len(sample_ids), 0, dtype=torch.long))
    if not candidates:
        raise ValueError(f"no denoising step of [{first}, {num_steps}) can be trained: use more steps")
    count = trained_count(len(candidates), algorithm.timestep_fraction, algorithm.step_rounding)
    if algorithm.train_timesteps == "first":
        sde = candidates[:count] if algorithm.untrained_steps == "ode" else candidates
        trained = torch.arange(count).expand(len(sample_ids), count).clone()
        return StepPlan(sde, trained)
    rows = []
    for sample_id in sample_ids:
        generator = torch.Generator().manual_seed(sample_seed(seed, f"train-steps:{sample_id}"))
        rows.append(torch.randperm(len(candidates), generator=generator)[:count].sort().values)
    return StepPlan(candidates, torch.stack(rows) if rows else torch.zeros(0, count, dtype=torch.long))


def compressed_schedule(algorithm, schedule: list, plan: StepPlan) -> list:
    """`sde_window.post_compress` (MixGRPO-Flash's `dpm_post_compress_ratio`): the k = n - e deterministic steps
    after the window (e = one past its last step) run as max(int((k + 1) x ratio) - 1, 1) steps, fewer model
    forwards for the same start and end. `post_spacing: time` (MixGRPO's `run_sample_step`): their noise levels are
    evenly spaced in unshifted time t from t_e to 0 and shifted, sigma = s t / (1 + (s - 1) t), with t_e = 1 - e / n
    and the shift s read off the grid at e (so the first one is the grid's sigma_e; exact for schedules shifted
    from linspace(1, 0, n + 1), as FLUX's and the reference's). `grid`: the grid points e, ..., n evenly spaced by
    index, rounded. The steps up to e keep the grid, so the window's stored transitions re-evaluate at the same
    noise levels. Without a window or a ratio, `schedule` as it is."""
    window = algorithm.sde_window
    if window is None or window.post_compress is None or not plan.sde:
        return schedule
    n, end = len(schedule) - 1, max(plan.sde) + 1
    steps = max(int((n - end + 1) * window.post_compress) - 1, 1)  # the reference allows 0: sampling stops at e
    if end >= n or steps >= n - end:
        return schedule
    if window.post_spacing == "grid":
        points = torch.linspace(end, n, steps + 1).round().long().tolist()
        return schedule[:end] + [schedule[i] for i in points]
    sigma_end, t_end = float(schedule[end]), 1 - end / n
    shift = sigma_end * (1 - t_end) / (t_end * (1 - sigma_end))
    times = torch.linspace(t_end, 0, steps + 1, dtype=torch.float64)
    sigmas = (shift * times / (1 + (shift - 1) * times)).tolist()
    return schedule[:end] + [sigma_end, *sigmas[1:]]
