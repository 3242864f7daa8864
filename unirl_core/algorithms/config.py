"""The `train.algorithm` section: the keys every RL algorithm shares (sampling of the stochastic steps, which steps
are trained, advantage conventions, the KL term, the optimizer). Each algorithm's module subclasses
`AlgorithmConfig` with `name` as its literal, its paper's defaults for these keys (documented there) and its own
keys; `unirl_core.config.schema` makes the section a union of them discriminated by `name`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from unirl_core.config.schema_base import Count, StrictModel


class SDEWindowConfig(StrictModel):
    """An SDE window (Flow-GRPO-Fast, MixGRPO): only `size` consecutive denoising steps are stochastic and trained;
    every other step is a deterministic ODE step (no log-prob, no training forward). The window's first step is
    chosen per RL step within [`start`, `end` - `size`]; every sample of a step shares the window."""

    size: Annotated[Count, Field(ge=1)] = 2
    """Denoising steps in the window (Flow-GRPO-Fast: 1 or 2; MixGRPO: 4 of 25)."""

    start: Annotated[Count, Field(ge=0)] = 0
    """First denoising step a window may cover."""

    end: int | None = None
    """Windows end at or before this step (exclusive); negative: counted back from the last step a window may
    cover, as in a Python slice (MixGRPO's -1: its `max_timesteps = n - 2`); empty: the last denoising step."""

    end_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    """Instead of `end`: windows end by int(n x end_fraction) of the n denoising steps (FlowDPPO's first half)."""

    mode: Literal["fixed", "random", "sliding", "subset"] = "random"
    """`fixed`: always [start, start + size). `random` (Flow-GRPO-Fast): the window's first step uniform in its
    range, drawn per RL step from (sampling.seed, step). `sliding` (MixGRPO): starts at `start` and moves `stride`
    steps every `shift_every` RL steps, back to `start` after the last position. `subset` (FlowDPPO): `size`
    distinct steps of the range drawn per RL step, not necessarily adjacent. Every mode is a function of the RL
    step, so a resumed run continues on the window it had."""

    shift_every: Annotated[Count, Field(ge=1)] = 25
    """`sliding`: RL steps between moves (MixGRPO's shift interval)."""

    stride: Annotated[Count, Field(ge=1)] = 1
    """`sliding`: denoising steps moved per shift."""

    tail: Literal["shrink", "full"] = "shrink"
    """`sliding`: `shrink` (MixGRPO's code): the window moves on to `end` itself, its last positions cut at `end`
    (4, 3, 2, 1 steps, then an empty window: those RL steps roll out and train nothing), then restarts. `full`: it
    restarts after the last position where it fits whole, so every RL step trains `size` steps (use it when the
    rollouts of the tail's RL steps are too dear to spend on fewer or no trained steps)."""

    post_compress: Annotated[float, Field(gt=0, lt=1)] | None = None
    """MixGRPO-Flash's `dpm_post_compress_ratio`: the k ODE steps after the window run as
    max(int((k + 1) x ratio) - 1, 1) steps (25 steps, window 0-3, 0.4: 7 instead of 21), fewer forwards per
    rollout; pair it with `ode_solver: dpm2m`. Empty: every grid step runs."""

    post_spacing: Literal["time", "grid"] = "time"
    """`post_compress`: where the thinned steps fall. `time` (MixGRPO-Flash's code): evenly spaced in unshifted time
    after the window, off the scheduler's grid. `grid`: on grid points evenly spaced by index (rounded), so every
    noise level is one the uncompressed rollout also visits (use it to compare compressed and full rollouts)."""


class AlgorithmConfig(StrictModel):
    """The RL algorithm: its loss, which denoising steps are stochastic and trained, and the advantage conventions.
    The keys a recipe leaves out take the named algorithm's defaults (its config class in
    `unirl_core/algorithms/<name>.py`)."""

    name: str = "grpo"
    """The algorithm: a built-in name (`unirl_core.algorithms.registry.BUILT_IN`: grpo, reinforce, flow_grpo_fast,
    mixgrpo, mixgrpo_flash, dancegrpo, grpo_guard, flow_dppo, diffusion_nft) or an `Algorithm` subclass in any
    importable module as `package.module:ClassName`. docs/algorithms.md compares them."""

    @model_validator(mode="before")
    @classmethod
    def _merge_window(cls, data):
        """A partial `sde_window` in the recipe merges into this algorithm's default window (MixGRPO's 4-step
        sliding window with `size: 2` keeps its mode and moves)."""
        default = cls.model_fields["sde_window"].default
        if isinstance(data, dict) and isinstance(data.get("sde_window"), dict) and default is not None:
            data = {**data, "sde_window": {**default.model_dump(exclude_unset=True), **data["sde_window"]}}
        return data

    sde_type: str = "sde"
    """The stochastic step (a sampler of `unirl_core/domains/diffusion/rollout/samplers/`): Flow-GRPO's SDE (`sde`, std
    eta sqrt(sigma / (1 - sigma)) sqrt(|dt|); on DDIM families, DDIM with eta), Coefficients-Preserving Sampling
    (`cps`, arXiv 2509.05952: std sigma_next sin(eta pi / 2), the noise level kept exact; flow_grpo's Fast configs
    use it with eta 0.8), DanceGRPO's (`dance`, std eta sqrt(|dt|)), or a `Sampler` subclass in any importable
    module as `package.module:ClassName`. DDIM families (sd15, sdxl) take `sde` (their eta sampler) only."""

    @field_validator("sde_type")
    @classmethod
    def _known_sampler(cls, value: str) -> str:
        from unirl_core.domains.diffusion.rollout.samplers.registry import sampler_classes

        sampler_classes(value)  # an unknown or unimportable name: its error says what is allowed
        return value

    ode_solver: Literal["euler", "dpm2m"] = "euler"
    """Deterministic (eta 0) rollout steps after the last SDE step: the family's own first-order step (`euler`:
    flow matching's Euler step, DDIM's eta-0 step) or DPM-Solver++ 2M (`dpm2m`: second order from the previous
    step's x0 prediction, diffusers' DPMSolverMultistepScheduler at the same model forwards; DiffusionNFT's `dpm2`
    rollouts, MixGRPO-Flash after its window). The first and last steps stay first order. Evaluation images use
    the family's own step (as both references evaluate)."""

    exclude_last_step: bool = False
    """The last denoising step (to sigma 0) is never stochastic or trained (DanceGRPO, MixGRPO; `cps` has no noise
    there, so with `cps` the last step is always excluded)."""

    eta: Annotated[float, Field(ge=0)] = 0.7
    """Sampler noise level: flow SDE `eta` (sd3) or DDIM `eta` (sd15, 1.0 is DDPO's)."""

    timestep_fraction: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Fraction of the denoising steps (of the `sde_window` when set) that are trained: the first ones (early,
    high-noise), or a random subset per sample with `train_timesteps: random`. How many: see `step_rounding`."""

    step_rounding: Literal["round", "floor"] = "round"
    """Trained steps = round(n x timestep_fraction) (`round`, at least 1) or int(n x timestep_fraction) (`floor`,
    at least 1: flow_grpo and DDPO). 10 steps x 0.99: 10 with `round`, 9 with `floor`."""

    train_timesteps: Literal["first", "random"] = "first"
    """Which steps are trained: the `first` ones (Flow-GRPO), or a `random` subset per sample, drawn from
    (seed, step, sample id) (DDPO, DanceGRPO); `random` runs every candidate step stochastically."""

    untrained_steps: Literal["ode", "sde"] = "ode"
    """Denoising steps that are not trained (outside an `sde_window`: always `ode`): deterministic (`ode`, eta 0:
    the sample then depends on the trained steps' noise only) or with the SDE noise too (`sde`: flow_grpo, DDPO)."""

    sde_window: SDEWindowConfig | None = None
    """Train on a window of SDE steps, ODE elsewhere (Flow-GRPO-Fast, MixGRPO); empty: every step is a candidate."""

    clip_range: Annotated[float, Field(gt=0)] = 1e-4
    """PPO clip range epsilon on the per-step ratio."""

    adv_clip: Annotated[float, Field(gt=0)] = 5.0
    """Advantages are clipped to [-adv_clip, adv_clip]."""

    std_mode: Literal["group", "batch", "per_prompt", "none"] = "group"
    """Advantage normalization: `group` (GRPO: each group's mean and std), `batch` (group mean, one batch-wide std:
    steadier when rewards within a group are nearly equal), `per_prompt` (DDPO's tracker: each prompt's recent
    rewards, see `tracker_buffer_size` and `tracker_min_count`), or `none` (Dr. GRPO: the group mean subtracted,
    no division by a std)."""

    std_ddof: Annotated[int, Field(ge=0, le=1)] = 0
    """`group` and `batch` std: the population std (0: flow_grpo's np.std) or the N - 1 one (1: DanceGRPO's and
    MixGRPO's torch .std(); a group of 4 gets advantages sqrt(3/4) = 0.87x as large)."""

    adv_eps: Annotated[float, Field(gt=0)] = 1e-4
    """Added to the std before dividing (flow_grpo 1e-4; DanceGRPO and MixGRPO 1e-8)."""

    tracker_buffer_size: Annotated[Count, Field(ge=1)] = 32
    """`per_prompt`: rewards remembered per prompt."""

    tracker_min_count: Annotated[Count, Field(ge=1)] = 16
    """`per_prompt`: until a prompt has this many rewards, the batch's mean and std are used."""

    beta: Annotated[float, Field(ge=0)] = 0.0
    """KL weight to the reference policy (0: no KL term). Its strength depends on `kl_form`."""

    kl_form: Literal["step", "flow_grpo"] = "step"
    """`step`: the exact KL between the Gaussian step policies, |mean - mean_ref|^2 / (2 std^2) with the step's
    std (std_t sqrt(|dt|)). `flow_grpo`: flow_grpo's form, the squared mean difference over 2 std_t^2 with the
    SDE's noise scale std_t without the step's sqrt(|dt|), i.e. the exact KL times |dt|: the same `beta`
    (flow_grpo's 0.04) is 4-100x weaker per step in this form.
    DDIM families have no dt: both forms are the exact KL there."""

    cfg_gradient: Literal["both", "detach_uncond"] = "both"
    """Training forwards with CFG on: gradients flow through both branches (`both`: what flow_grpo's and DDPO's code
    does) or only the conditional one (`detach_uncond`). The values, and so the ratios, are the same."""

    group_by: Literal["position", "prompt"] = "position"
    """GRPO groups: the `samples_per_prompt` siblings of one rollout prompt (`position`), or every sample of the
    step with the same prompt text (`prompt`: flow_grpo; a prompt drawn twice in a step is one group)."""

    drop_zero_advantage: bool = False
    """Leave samples whose advantage is exactly 0 (e.g. a group with equal rewards) out of the policy loss and its
    mean (flow_grpo); `false` keeps them (they add nothing to the policy gradient but count in the mean)."""

    learning_rate: Annotated[float, Field(gt=0)] = 3e-4
    """AdamW learning rate."""

    lr_schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule over the run's optimizer steps: `constant`, or `cosine` decay to zero (after the
    warm-up). Cosine keeps a converged policy from random-walking at full step size once reward variance is small."""

    warmup_steps: Annotated[Count, Field(ge=0)] = 0
    """Optimizer steps of linear warm-up from 0 to `learning_rate`."""

    max_grad_norm: Annotated[float, Field(gt=0)] = 1.0
    """Gradient clipping norm."""

    num_updates_per_batch: Annotated[Count, Field(ge=1)] = 1
    """Disjoint mini-batches (optimizer steps) per rollout; pi_old is frozen once per rollout. Only `grpo` takes
    more than one: `reinforce` has no ratio to correct for a policy that moved."""

    micro_batch_size: Annotated[Count, Field(ge=1)] = 4
    """Samples per forward/backward inside a mini-batch (gradient accumulation)."""
