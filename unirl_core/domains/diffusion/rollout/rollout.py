"""One rollout: prompts expanded into groups -> denoising with log-probs on the trained steps -> decoded images.

Returns, per trained step, the latents before and after (float32), the step index and the log-prob, so the
train stack can re-evaluate each stored transition under the current weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from unirl_core.algorithms.registry import algorithm_class
from unirl_core.data.grpo_groups import RolloutSample
from unirl_core.data.noise import sample_generators
from unirl_core.domains.diffusion.rollout.conditions import ConditionLatents, condition_uri
from unirl_core.domains.diffusion.rollout.ode import OdeSteps
from unirl_core.domains.diffusion.rollout.step_plan import compressed_schedule, plan_steps


@dataclass
class Rollout:
    samples: list[RolloutSample]
    cond: dict  # conditioning of every sample (CFG halves when guidance is on)
    schedule: list  # sigmas (flow) or timesteps (DDIM), one more than the steps run (`compressed_schedule`)
    steps: list[int]  # indices of the stochastic (SDE) steps, whose transitions are stored
    latents_TB: torch.Tensor  # [T, B, C, h, w] float32, x before each stochastic step
    next_latents_TB: torch.Tensor  # [T, B, C, h, w] float32, x after it
    logp_TB: torch.Tensor  # [T, B] float32
    images: list  # PIL images
    trained_BJ: torch.Tensor | None = None  # [B, J] positions in `steps` each sample trains (None: all of them)
    final_latents: torch.Tensor | None = None  # [B, C, h, w] float32, the denoised latents the images decode from
    seed: int = 0  # the rollout's seed (fresh training noise of likelihood-free algorithms derives from it)

    @property
    def outputs(self) -> list:
        """What the rewards score (the domain contract's name): the images."""
        return self.images

    def trained(self) -> torch.Tensor:
        if self.trained_BJ is None:
            return torch.arange(len(self.steps)).expand(len(self.samples), -1)
        return self.trained_BJ


def start_step(num_steps: int, strength: float) -> int:
    """The first denoising step of an image-to-image rollout (diffusers' `strength`: the fraction of steps run)."""
    return num_steps - max(1, min(num_steps, int(num_steps * strength)))


def with_condition_images(family, samples, sampling, cond, x, schedule, conditions=None):
    """(conditioning, x, first step) of a batch: unchanged for text-to-image; with condition images, an edit family
    (`condition_mode == "reference"`) gets them in its conditioning, any other starts image-to-image from the noised
    image at `start_step`. A batch is all text-to-image or all with condition images."""
    uris = [condition_uri(s) for s in samples]
    if not any(uris):
        return cond, x, 0
    if not all(uris):
        plain = next(s.example.prompt_id for s, uri in zip(samples, uris, strict=True) if uri is None)
        raise ValueError(
            f"a rollout batch mixes prompts with and without condition images (e.g. prompt {plain}); "
            "put image-to-image prompts in their own prompt file"
        )
    if family.condition_mode == "none":
        with_image = next(s.example.prompt_id for s, uri in zip(samples, uris, strict=True) if uri is not None)
        raise ValueError(
            f"prompt {with_image} has a condition image but family {family.name!r} takes text only; "
            "drop the prompt's `media_refs` or choose a family with a condition image (`unirl families`)"
        )
    conditions = conditions or ConditionLatents(family)
    clean = conditions(uris, sampling.width, sampling.height)
    if family.condition_mode == "reference":  # edit models: the image conditions, the noise is denoised
        images = conditions.load(uris, sampling.width, sampling.height)
        return family.with_condition_images(cond, [s.example.prompt for s in samples], images, clean), x, 0
    start = start_step(sampling.num_inference_steps, sampling.condition_strength)
    return cond, family.noised(clean, x, start, schedule).float(), start


def initial_latents(family, samples: list[RolloutSample], sampling, seed: int) -> tuple[torch.Tensor, tuple]:
    """Each sample's initial noise, float32 (its group's with `share_group_noise`), and one sample's latent shape."""
    shape = family.sample_shape(sampling)
    noise_ids = [f"prompt:{s.group_id}" if sampling.share_group_noise else s.sample_id for s in samples]
    return family.initial_noise(noise_ids, seed, shape).float(), shape


def trained_steps(family, schedule):
    """Which steps may train, for `plan_steps`: all (None), or a family with experts' `trains_step` (Wan 2.2 with a
    frozen expert: that expert's steps are no candidates)."""
    return (lambda index: family.trains_step(index, schedule)) if family.expert_names else None


@torch.no_grad()
def run_rollout(
    family, samples: list[RolloutSample], sampling, algorithm, seed: int, conditions=None, step: int = 0
) -> Rollout:  # `algorithm`: the `train.algorithm` config
    """Denoise `samples` from their initial noise; prompts with a condition image start image-to-image at
    `start_step`, or, for an edit family (`condition_mode == "reference"`), carry the image in their conditioning
    (a batch is all text-to-image or all with condition images). `conditions`: a ConditionLatents.

    Every draw depends on (seed, sample id) only (the caller passes seed = sampling seed + step): the initial noise,
    and the SDE steps' noise from one generator per sample, so a sample rolls out the same on any number of ranks.
    Which steps are stochastic and trained: `plan_steps` at RL step `step` (SDE windows move with it). A
    likelihood-free algorithm (DiffusionNFT) rolls out with the ODE (eta 0) and stores no transitions: `steps` are
    then the grid steps it may train on, at fresh noisings of `final_latents`. Deterministic steps run
    `algorithm.ode_solver` after the last SDE step (`OdeSteps`), on the grid `compressed_schedule` leaves."""
    step_sampling = family.step_sampling(algorithm)
    cond = family.encode([s.example.prompt for s in samples])
    x, shape = initial_latents(family, samples, sampling, seed)
    schedule = family.schedule(sampling.num_inference_steps, shape)
    cond, x, start = with_condition_images(family, samples, sampling, cond, x, schedule, conditions)
    ids, trains = [s.sample_id for s in samples], trained_steps(family, schedule)
    plan = plan_steps(algorithm, start, sampling.num_inference_steps, step, seed, ids, trains)
    schedule = compressed_schedule(algorithm, schedule, plan)
    num_steps = len(schedule) - 1
    before, after, logps = [], [], []
    generators = sample_generators(seed, [f"sde:{s.sample_id}" for s in samples], device=x.device)
    likelihood_free = algorithm_class(algorithm.name).likelihood_free  # records no transitions
    first_multistep = max(plan.sde) + 1 if plan.sde and not likelihood_free else start
    ode = OdeSteps(algorithm.ode_solver, lambda i: family.noise_level(i, schedule), num_steps, first_multistep)
    for index in range(start, num_steps):
        stochastic = index in plan.sde and not likelihood_free
        eta = algorithm.eta if stochastic else 0.0
        result = family.transition(x, index, eta, cond, schedule, generator=generators, sampling=step_sampling)
        if stochastic:
            before.append(x)
            after.append(result.sample)
            logps.append(result.log_prob)
        x = ode(index, result, stochastic)
    empty = x.new_zeros(0, *x.shape)  # nothing stored (likelihood-free): [0, B, ...]
    stored = ((before, empty), (after, empty), (logps, x.new_zeros(0, len(samples))))
    stacks = [torch.stack(values) if values else nothing for values, nothing in stored]
    return Rollout(
        samples, cond, schedule, plan.sde, *stacks, family.decode(x), plan.trained_BJ, final_latents=x, seed=seed
    )  # fmt: skip
