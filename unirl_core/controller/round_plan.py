"""The round plan and what is refused before any round starts.

plan_rounds(config)          -> warm-up rounds, then RL rounds, over one global step count
validate(config, precache)   -> TrainingConfigError with the arithmetic, before any Prefect or Ray work
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from unirl_core.config.schema import TrainConfig
from unirl_core.domains.registry import domain_class
from unirl_core.errors import UserError


class TrainingConfigError(UserError, ValueError):
    """A recipe that cannot train as configured (the message shows the arithmetic); never retried."""


class RoundDeadlineError(TimeoutError):
    """The round ran past `train.ray.round_timeout_s`; its committed checkpoints remain, a retry resumes."""


@dataclass(frozen=True)
class Round:
    stage: str  # "warmup" or "rl"
    index: int  # 0-based within the stage
    first: int  # first global step (inclusive)
    end: int  # last global step + 1
    stage_start: int  # global step of the stage's step 0

    @property
    def name(self) -> str:
        return f"{self.stage} round {self.index}"


def plan_rounds(config: TrainConfig) -> list[Round]:
    """Warm-up steps are global steps 0..W-1, RL steps W..W+S-1; each stage is cut into its rounds."""
    rounds: list[Round] = []
    start = 0
    for stage, steps, per_round in (
        ("warmup", config.warmup.steps, config.warmup.steps_per_round),
        ("rl", config.steps, config.steps_per_round),
    ):
        per_round = per_round or max(steps, 1)
        for index, first in enumerate(range(0, steps, per_round)):
            rounds.append(Round(stage, index, start + first, start + min(steps, first + per_round), start))
        start += steps
    return rounds


def validate(config: TrainConfig, precache=None) -> None:
    """Refuse up front what would fail mid-round, with the arithmetic."""
    problems = config_problems(config, precache) + _data_problems(config) + _machine_problems(config)
    if problems:
        raise TrainingConfigError("training cannot start:\n  " + "\n  ".join(problems))


def config_problems(config: TrainConfig, precache=None) -> list[str]:
    """What the recipe alone shows cannot train (no prompt file read, no machine asked): the workers' and
    groups' arithmetic, image sizes, warm-up keys, dtype. `unirl validate` reports these too."""
    ray_problems = [(f"ray.{path}", value, message) for path, value, message in config.ray.problems()]
    problems = [
        f"train.{path}: {value!r} must be {message}"
        for path, value, message in [*ray_problems, *config.distributed_problems()]
    ]
    problems += domain_class(config.domain.name).start_problems(config) + _warmup_problems(config, precache)
    if config.model.dtype == "float16":  # no loss scaling: fp16 gradients underflow; bf16 has fp32's range
        problems.append("train.model.dtype: 'float16' cannot train (no loss scaling); use bfloat16 or float32")
    return problems


def _machine_problems(config: TrainConfig) -> list[str]:
    """A local Ray started for the round (or `--local`) has this machine's CPUs and GPUs; an existing cluster
    (`train.ray.address`) is asked when the round connects to it (`distributed.groups.worker_group`)."""
    from unirl_core.distributed.resources import shortfalls, starts_local_ray, this_machine

    if not starts_local_ray(config.ray):
        return []
    rewards = config.reward if config.steps else None  # reward actors start with the RL rounds only
    return shortfalls(config.ray, this_machine(), "this machine", rewards)


def _data_problems(config: TrainConfig) -> list[str]:
    from unirl_core.data.sources import build_source

    try:
        source = build_source(config.data)
    except ValueError as exc:
        raise TrainingConfigError(f"training cannot start: train.data: {exc}") from None
    available = getattr(source, "prompts", None)
    problems = []
    if available is not None and len(available) < config.data.prompts_per_rollout:
        problems.append(
            f"train.data.prompts_per_rollout: {config.data.prompts_per_rollout} prompts per rollout, but the source "
            f"has only {len(available)} prompts; lower it or add prompts"
        )
    return problems + _eval_problems(config)


def _eval_problems(config: TrainConfig) -> list[str]:
    """`train.eval`'s prompt sets load (a packaged set's name or a readable prompt file)."""
    from unirl_core.data.prompts import PromptDataError, load_prompts
    from unirl_core.evaluation import prompt_sets

    problems = []
    for i, eval_set in enumerate(config.eval.sets if config.eval and config.steps else []):
        try:
            load_prompts(prompt_sets.resolve(eval_set.prompts))
        except PromptDataError as exc:
            problems.append(f"train.eval.sets.{i}.prompts: {exc} (or a packaged set: {', '.join(prompt_sets.SETS)})")
    return problems


def _warmup_problems(config: TrainConfig, precache) -> list[str]:
    if not config.warmup.steps:
        return []
    if precache is None:
        return [
            f"train.warmup.steps: {config.warmup.steps} warm-up steps need the recipe's `precache` section (the "
            "precached latents and text conditioning to train on)"
        ]
    keys = [e.key for e in precache.encodings]
    return [
        f"train.warmup.{name}: {getattr(config.warmup, name)!r} is not an encoding of the recipe's precache "
        f"section (it has {keys})"
        for name in ("latent_key", "text_key")
        if getattr(config.warmup, name) not in keys
    ]


def worker_credentials(config: TrainConfig) -> list[str]:
    """Environment variables the recipe's components read credentials from on the workers (remote scorers'
    `auth_header_env`): forwarded to Ray workers by name from the driver's environment, values never logged."""
    return sorted({remote.auth_header_env for remote in config.reward.remote.values() if remote.auth_header_env})


def output_dir(config: TrainConfig) -> Path:
    if not config.output_dir:
        raise TrainingConfigError("train.output_dir is empty: load the recipe with load_recipe (it fills it in)")
    if "://" in config.output_dir and not config.output_dir.startswith("file://"):
        raise TrainingConfigError(
            f"train.output_dir={config.output_dir!r}: training rounds write checkpoints to a local or shared "
            "filesystem path (mount the bucket, e.g. with a CSI driver, on every node)"
        )
    return Path(config.output_dir.removeprefix("file://"))


def split_even(items: list, workers: int) -> list[list]:
    """Equal contiguous shares (samples are group-major, so a share of whole groups never cuts a group)."""
    per_rank = len(items) // workers
    return [items[r * per_rank : (r + 1) * per_rank] for r in range(workers)]


def indexed_shares(items: list, workers: int) -> list[tuple[list, int]]:
    """(share, index of its first item) per rank of evaluation `items`, padded with the first items to equal shares
    (every rank runs the same passes: FSDP's collectives need that); results past len(items) are padding."""
    padded = [items[i % len(items)] for i in range(-(-len(items) // workers) * workers)]
    per_rank = len(padded) // workers
    return [(share, r * per_rank) for r, share in enumerate(split_even(padded, workers))]
