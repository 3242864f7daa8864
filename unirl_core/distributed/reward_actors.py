"""Model rewards on their own Ray actors (`train.reward.placement: dedicated`).

    training worker r --(its rank's images, split in `actors.workers` contiguous parts)--> reward actor a
                      <--(one float per image, in order)---------------------------------

Each reward actor loads every model reward of the recipe once (on its own GPU or CPUs, outside the training
workers' placement group) and scores a whole part per call; a rank waits for all its parts at once. An actor that
dies (the kernel's OOM killer, a crashed CUDA context, a kill) is restarted by Ray, which reloads its models and
re-runs the call: the step goes on with the same scores, neither lost nor counted twice. Past `actors.max_restarts`
the scorer raises ScorerUnavailableError (transient): the round resumes from its last committed checkpoint, as it
does after a CUDA out-of-memory error inside a live actor. A reward's own error (a prompt OCR cannot score, a
missing GenEval record) arrives as itself, one line, and is permanent.

Images travel as uint8 arrays through Ray's object store; the policy workers receive `DedicatedScorer`s, which are
called like any reward (unirl_core/rewards/registry.py `Scorer`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import ray
from PIL import Image

from unirl_core.errors import UserError
from unirl_core.rewards.errors import RewardError, ScorerUnavailableError

logger = logging.getLogger(__name__)

ACTOR_NAME = "unirl-reward-{index}"  # in this driver's namespace: `ray.get_actor` finds them while a round runs


class RewardActor:
    """Every model reward of a recipe, loaded once in this actor's process on its device."""

    def __init__(self, reward_json: str, names: list[str], cpus: float):
        import torch

        from unirl_core.config.schema import RewardConfig
        from unirl_core.models.logs import quiet_model_libraries
        from unirl_core.rewards.registry import build_scorers

        quiet_model_libraries()
        torch.set_num_threads(max(1, int(cpus)))
        config = RewardConfig.model_validate_json(reward_json)
        device = "cuda" if ray.get_gpu_ids() else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES to this actor's GPU
        everything = set(config.weights) | set(config.guards) | set(config.remote)
        self.scorers, self.problem = {}, None
        try:
            self.scorers = build_scorers(config, device, skip=everything - set(names))
        except (OSError, ValueError, ImportError) as exc:  # a missing or wrong folder, a missing package: permanent
            self.problem = str(exc)

    def ready(self) -> str | None:
        """None once every reward is loaded, else why one could not be (the user's error message)."""
        return self.problem

    def score(self, name: str, pixels: list[np.ndarray], prompts: list[str], sample_ids: list[str],
              metadata: list[dict] | None) -> list[float]:  # fmt: skip
        import torch

        if self.problem:  # a restart whose reload failed
            raise RewardError(f"reward actor could not reload {name}: {self.problem}")
        scorer = self.scorers[name]
        images = [Image.fromarray(p) if isinstance(p, np.ndarray) else p for p in pixels]  # text outputs: as sent
        try:
            if getattr(scorer, "wants_metadata", False):
                return [float(s) for s in scorer(images, prompts, sample_ids, metadata=metadata)]
            return [float(s) for s in scorer(images, prompts, sample_ids)]
        except torch.OutOfMemoryError as exc:  # the process lives on: a retried round may find the memory free
            raise ScorerUnavailableError(
                f"reward {name} ran out of GPU memory on its actor ({len(images)} images): lower "
                f"train.reward.{name}'s batch_size or give the actors more memory ({str(exc).splitlines()[0]})"
            ) from None


class DedicatedScorer:
    """Reward `name` as the training workers call it, scored by the reward actors (picklable: actor handles)."""

    def __init__(self, name: str, actors: list, wants_metadata: bool):
        self.name, self.actors, self.wants_metadata = name, actors, wants_metadata

    def __call__(self, images: Sequence[Image.Image], prompts: Sequence[str], sample_ids: Sequence[str] = (),
                 metadata: Sequence[dict] | None = None) -> np.ndarray:  # fmt: skip
        pixels = [np.asarray(o.convert("RGB")) if isinstance(o, Image.Image) else o for o in images]  # text: as is
        parts = [p for p in np.array_split(np.arange(len(images)), len(self.actors)) if len(p)]
        calls = [
            actor.score.remote(self.name, [pixels[i] for i in part], [prompts[i] for i in part],
                               [sample_ids[i] for i in part] if len(sample_ids) else [str(i) for i in part],
                               [metadata[i] for i in part] if metadata is not None else None)
            for actor, part in zip(self.actors, parts, strict=False)
        ]  # fmt: skip
        try:
            scores = ray.get(calls)
        except ray.exceptions.RayActorError as exc:
            raise ScorerUnavailableError(
                f"reward {self.name}: a reward actor died more often than train.reward.actors.max_restarts allows "
                f"({exc.__class__.__name__}); the round resumes from its last checkpoint"
            ) from None
        except ray.exceptions.RayTaskError as exc:  # the actor's own error and one-line message, not Ray's traceback
            if isinstance(exc.cause, UserError | ConnectionError):
                raise exc.cause from None
            raise
        return np.asarray([s for part in scores for s in part], dtype=np.float64)


@contextlib.contextmanager
def reward_actors(
    config, names: list[str], runtime_env: dict | None = None, start_timeout_s: float = 900
) -> Iterator[dict[str, DedicatedScorer]]:
    """`config.actors.workers` reward actors serving `names` (model rewards of `config`, a RewardConfig) for the
    block, as {name: DedicatedScorer}; killed when the block ends. `runtime_env`: the training workers' (forwarded
    variables, working_dir). Waits until every actor is placed and has loaded its models (a missing weights folder
    fails here, before any rollout)."""
    from unirl_core.rewards.names import METADATA_REWARDS

    settings = config.actors
    actor_cls = ray.remote(
        num_cpus=settings.cpus_per_worker,
        num_gpus=settings.gpus_per_worker,
        max_restarts=settings.max_restarts,
        max_task_retries=settings.max_restarts,  # a call in flight when the actor died runs again on its restart
    )(RewardActor)
    actors = [
        actor_cls.options(name=ACTOR_NAME.format(index=index), runtime_env=runtime_env or None).remote(
            config.model_dump_json(), names, settings.cpus_per_worker
        )
        for index in range(settings.workers)
    ]
    try:
        try:
            problems = ray.get([actor.ready.remote() for actor in actors], timeout=start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RewardError(
                f"the {settings.workers} reward actor(s) ({settings.cpus_per_worker:g} CPUs, "
                f"{settings.gpus_per_worker:g} GPUs each: train.reward.actors) did not start within "
                f"{start_timeout_s:g} s: no node may have that much free, or loading {', '.join(names)} takes longer"
            ) from None
        except ray.exceptions.RayActorError as exc:  # died while loading (e.g. out of memory)
            raise ScorerUnavailableError(f"a reward actor died loading {', '.join(names)}: {exc}") from None
        if any(problems):
            raise RewardError(f"the reward actors could not load {', '.join(names)}: {next(filter(None, problems))}")
        logger.info("%d reward actor(s) serve %s", len(actors), ", ".join(names))
        yield {name: DedicatedScorer(name, actors, name in METADATA_REWARDS) for name in names}
    finally:
        for actor in actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)


__all__ = ["ACTOR_NAME", "DedicatedScorer", "RewardActor", "reward_actors"]
