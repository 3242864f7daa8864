"""The image-diffusion domain: the recipe's `train.model` family with its FSDP2-sharded denoiser (LoRA or full), the
algorithm's train stack, rollouts of latent trajectories decoded to images (what the rewards score), deterministic
evaluation samples, the supervised warm-up on precached latents, image grids, and exports `from_pretrained` loads
(a peft/diffusers LoRA, or the merged pipeline).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from unirl_core.domains.base import Domain


class DiffusionDomain(Domain):
    stages: ClassVar[frozenset[str]] = frozenset({"rl", "warmup"})
    outputs: ClassVar[str | None] = "image"

    # --- rank side --------------------------------------------------------------------------------------------

    def build_policy(self):
        """The family of `train.model`, loaded on the rank's device (its `trainable` is the denoiser)."""
        from unirl_core.models.registry import build_family

        return build_family(self.config.model, self.config.sampling, device=str(self.device))

    def rl_stack(self, policy):
        from unirl_core.domains.diffusion.stack import build_stack

        config = self.config
        return build_stack(
            policy, config.algorithm, total_updates=config.steps * config.algorithm.num_updates_per_batch,
            gather=not config.fsdp.reshard_after_forward,
        )  # fmt: skip

    def rollout(self, policy, stack, samples: list, step: int):
        """Latent trajectories of `samples` with the algorithm's sampler; `outputs`: the decoded images."""
        from unirl_core.domains.diffusion.rollout.rollout import run_rollout

        config = self.config
        return run_rollout(policy, samples, config.sampling, config.algorithm, seed=config.sampling.seed + step,
                           step=step)  # fmt: skip

    def evaluate(self, policy, stack, prompts: list[str], first_index: int, seed: int, steps: int | None = None,
                 guidance: float | None = None) -> list:  # fmt: skip
        """Deterministic samples (eta 0) of `prompts`, noise fixed per prompt index, at the evaluation steps and
        guidance (`sampling.eval_*`, or those given), with the stack's sampler (no stack, as in `unirl eval`: the
        algorithm's)."""
        sampling = self.config.sampling
        steps = steps or sampling.eval_steps
        family = policy.with_guidance(sampling.eval_guidance if guidance is None else guidance)
        step_sampling = stack.step_sampling if stack is not None else family.step_sampling(self.config.algorithm)
        ids = [f"eval:{first_index + i}" for i in range(len(prompts))]
        cond = family.encode(prompts)
        shape = family.sample_shape(sampling)
        x = family.initial_noise(ids, seed, shape).float()
        schedule = family.schedule(steps, shape)
        for index in range(steps):
            x = family.transition(x, index, 0.0, cond, schedule, sampling=step_sampling).sample
        return family.decode(x)

    def warmup_stack(self, policy):
        from unirl_core.domains.diffusion.stack import WarmupStack

        config = self.config
        return WarmupStack(policy, config.warmup, config.algorithm.max_grad_norm, not config.fsdp.reshard_after_forward)

    def warmup_step(self, policy, stack, batch: dict[str, Any], step: int) -> dict[str, float]:
        """One supervised step on this rank's share of precached (latent, conditioning) pairs."""
        from unirl_core.data.noise import sample_seed

        # per sample, from (seed, step, sample key): the same draws on any number of workers and micro-batches
        seed = self.config.warmup.seed
        generators = [torch.Generator().manual_seed(sample_seed(seed, f"{step}:{key}")) for key in batch["keys"]]
        latents = batch["latents"].to(self.device)
        cond = {k: v.to(self.device) for k, v in batch["cond"].items()}
        return stack.train(latents, cond, generators, step)

    def warmup_eval(self, policy, batch: dict[str, Any], seed: int, rank: int, draws: int = 4) -> float:
        """The denoising loss on this rank's share of a fixed batch, averaged over `draws` fixed noise draws."""
        from unirl_core.data.noise import sample_seed

        latents = batch["latents"].to(self.device)
        cond = {k: v.to(self.device) for k, v in batch["cond"].items()}
        generator = torch.Generator().manual_seed(sample_seed(seed, f"eval:{rank}"))
        return sum(policy.denoising_loss(latents, cond, generator).item() for _ in range(draws)) / draws

    # --- controller side --------------------------------------------------------------------------------------

    @classmethod
    def config_problems(cls, config):
        from unirl_core.algorithms.registry import algorithm_class

        yield from super().config_problems(config)
        name = config.algorithm.name
        if "diffusion" not in algorithm_class(name).domains:
            yield "algorithm.name", name, "an algorithm for the diffusion domain (its `domains` list 'diffusion')"
        if config.eval is not None and _edits(config.model.family):
            fix = ("null with an edit family: it edits a condition image per prompt and train.eval's prompt sets carry "
                   "none (evaluate an edit model with `unirl eval` on a prompt file with images)")  # fmt: skip
            yield "eval", config.model.family, fix

    @classmethod
    def outputs_of(cls, config) -> str | None:
        """The family's outputs (`Family.outputs`: "image" or "video"); None for an unknown family (no reward is
        refused for it: `start_problems` names the family)."""
        from unirl_core.models.registry import UnknownFamilyError, family_class

        try:
            return getattr(family_class(config.model.family), "outputs", "image")
        except UnknownFamilyError:
            return None

    @classmethod
    def _whose(cls, config) -> str:
        return f"the {config.model.family} family's"

    @classmethod
    def warmup_data(cls, config, precache):
        """Batches of precached (latent, text conditioning) pairs (`warmup.WarmupData`)."""
        from unirl_core.domains.diffusion.warmup import open_warmup_data

        return open_warmup_data(config, precache)

    @classmethod
    def split_warmup(cls, batch, workers: int) -> list:
        from unirl_core.domains.diffusion.warmup import split_batch

        return split_batch(batch, workers)

    @classmethod
    def start_problems(cls, config) -> list[str]:
        """An unknown family; a model folder the family cannot load (`registry.model_path_problems`); image sizes
        the family's latent grid cannot hold."""
        from unirl_core.models.registry import UnknownFamilyError, family_class, model_path_problems

        try:
            family_cls = family_class(config.model.family)
        except UnknownFamilyError as exc:
            return [f"train.model.family: {exc}"]
        factor = family_cls.latent_stride
        return (
            model_path_problems(config.model.family, config.model.path)
            + [
                f"train.sampling.{key}: {getattr(config.sampling, key)} must be a multiple of {factor} (the "
                f"{config.model.family} family's pixels per latent token: VAE stride x patch size)"
                for key in ("height", "width")
                if getattr(config.sampling, key) % factor
            ]
            + frames_problems(family_cls, config.sampling.num_frames)
            + experts_problems(family_cls, config.model.experts)
        )

    @classmethod
    def title(cls, config) -> str:
        return f"{config.model.family} ({config.model.path})"

    @classmethod
    def grid(cls, outputs: list, captions: list[str], cols: int):
        """Images, or videos as strips of 4 evenly spaced frames (the first and the last included), a row per
        caption."""
        from unirl_core.worker.images import captioned_grid

        return captioned_grid(outputs, captions, cols=cols)

    @classmethod
    def export(cls, policy, config, folder, merged: bool) -> bool:
        """A peft adapter folder plus diffusers' LoRA file; the merged pipeline with `merged` or full fine-tuning."""
        from unirl_core.models.registry import resolve_model_path

        base = resolve_model_path(config.model.path)
        if policy.has_lora and not merged:
            policy.export_adapter(folder, base)
            return False
        policy.export_merged(folder, base)
        return True

    @classmethod
    def model_card(cls, config, run_name: str):
        from unirl_core.tracking.model_card import ModelCard

        fmt = "peft-lora-adapter" if config.model.lora else "diffusers-pipeline"
        return ModelCard(run_name=run_name, family=config.model.family, base_model=config.model.path,
                         algorithm=config.algorithm.name, steps=config.steps, warmup_steps=config.warmup.steps,
                         height=config.sampling.height, width=config.sampling.width, format=fmt)  # fmt: skip

    @classmethod
    def export_config(cls, config):
        """The recipe an export rebuilds the family from: no text-embedding cache (it only reads weights)."""
        return config.model_copy(update={"model": config.model.model_copy(update={"text_embedding_cache": None})})


def frames_problems(family_cls, num_frames: int | None) -> list[str]:
    """`train.sampling.num_frames` against the family: empty for image families; set, and one more than a multiple
    of the VAE's temporal stride, for video families."""
    key, name, stride = "train.sampling.num_frames", family_cls.name, family_cls.temporal_stride
    if family_cls.outputs != "video":
        return [] if num_frames is None else [f"{key}: {num_frames}, but {name} makes images: leave it empty"]
    if num_frames is None:
        return [f"{key}: empty, but {name} makes videos: set the frames per video, (num_frames - 1) % {stride} == 0 "
                f"(e.g. {4 * stride + 1})"]  # fmt: skip
    if (num_frames - 1) % stride:
        lower, upper = num_frames - (num_frames - 1) % stride, num_frames - (num_frames - 1) % stride + stride
        return [f"{key}: {num_frames}, but (num_frames - 1) % {stride} = {(num_frames - 1) % stride}: the {name} VAE "
                f"keeps the first frame and compresses each {stride} after it into one latent frame; use {lower} "
                f"or {upper}"]  # fmt: skip
    return []


def experts_problems(family_cls, experts: list[str] | None) -> list[str]:
    """`train.model.experts` against the family's denoisers: empty, or some of its `expert_names`."""
    key, names = "train.model.experts", family_cls.expert_names
    if experts is None:
        return []
    if not names:
        return [f"{key}: {experts}, but {family_cls.name} has one denoiser: leave it empty"]
    unknown = [e for e in experts if e not in names]
    if unknown or not experts:
        return [f"{key}: {experts}: name some of {family_cls.name}'s experts {list(names)} (empty: all of them)"]
    return []


def _edits(family: str) -> bool:
    """Whether `family` edits condition images (`condition_mode` "reference"); an unknown family is not one here
    (`start_problems` names it)."""
    from unirl_core.models.registry import UnknownFamilyError, family_class

    try:
        return family_class(family).condition_mode == "reference"
    except UnknownFamilyError:
        return False
