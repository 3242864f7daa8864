"""A group of Ray actors joined by torch.distributed: the single-controller pattern (veRL, UniRL).

The controller creates N workers in one placement group (one bundle per worker), each joins a process group
(gloo on CPU, nccl on GPU), and the controller calls the same method on all of them. Hand-made actor groups
start about ten times faster than `ray.train.TorchTrainer` on CPU (STACK.md). `close()` kills the actors and
removes the placement group, so a failed call never leaves CPUs held for the next group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from unirl_core.distributed.rank import CollectiveError, TorchWorker, method_name
from unirl_core.distributed.worker_env import WorkerEnv, adopt_secrets
from unirl_core.errors import UserError
from unirl_core.io.storage import is_permanent

# Failures of the cluster rather than of the computation: the round retries from its last committed checkpoint.
LOST = (
    ray.exceptions.RayActorError,  # actor died (incl. ActorDiedError), e.g. killed or OOM-killed by the kernel
    ray.exceptions.GetTimeoutError,
    ray.exceptions.OutOfMemoryError,  # Ray's memory monitor killed a worker
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
)


class WorkerLostError(RuntimeError):
    """A worker (Ray actor) died or became unreachable, mid-round or while the group started, or a collective
    between the workers failed: retryable, the round resumes from its last committed checkpoint."""


class PlacementError(UserError, RuntimeError):
    """The cluster could not place the worker group's bundles within the deadline (the message names the resources
    asked and available): permanent, a retry would wait as long for the same answer. Not a TimeoutError, which
    rounds retry."""


class WorkerGroup:
    """N ranks of `worker_cls` in a placement group, joined by torch.distributed.

    `env`: the variables forwarded from the driver (`worker_env.WorkerEnv`): its runtime_env at process start, its
    secrets by a call before anything else runs. `strategy`: Ray's placement strategy of the bundles."""

    def __init__(
        self,
        world_size: int,
        worker_cls: type = TorchWorker,
        cpus_per_worker: float = 1,
        gpus_per_worker: float = 0,
        backend: str | None = None,
        ready_timeout_s: float = 120,
        collective_timeout_s: int = 300,
        strategy: str = "PACK",
        env: WorkerEnv | None = None,
    ):
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self.placement_group = placement_group([bundle] * world_size, strategy=strategy)
        self.workers: list[Any] = []
        self.env = env = env or WorkerEnv()
        try:
            self._wait_placed(bundle, world_size, strategy, ready_timeout_s)
            actor_cls = ray.remote(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker)(worker_cls)
            self.workers = [
                actor_cls.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.placement_group, placement_group_bundle_index=i
                    ),
                    runtime_env=env.runtime_env() or None,
                ).remote()
                for i in range(world_size)
            ]
            # every start call through `_get`: a worker lost while the group starts is a retryable WorkerLostError
            if env.secrets:
                self._get([w.__ray_call__.remote(adopt_secrets, env.secrets) for w in self.workers], None)
            (master_addr, master_port), *_ = self.run(TorchWorker.rendezvous_address, world_size, collective_timeout_s,
                                                      ranks=[0])  # fmt: skip
            self.backends = self.scatter(TorchWorker.setup, list(range(world_size)), world_size, master_addr,
                                         master_port, backend, collective_timeout_s)  # fmt: skip
        except BaseException:
            self.close()
            raise

    def _wait_placed(self, bundle: dict[str, float], count: int, strategy: str, timeout_s: float) -> None:
        try:
            ray.get(self.placement_group.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            total = {name: value * count for name, value in bundle.items()}
            available, cluster = ray.available_resources(), ray.cluster_resources()
            nodes = sum(1 for node in ray.nodes() if node["Alive"])
            raise PlacementError(
                f"the Ray cluster could not place the worker group within {timeout_s:g} s "
                f"(train.ray.placement_timeout_s): asked {count} bundles of {_resources(bundle, bundle)} with "
                f"strategy {strategy} ({_resources(total, bundle)} in all); available {_resources(available, bundle)} "
                f"of {_resources(cluster, bundle)} on {nodes} node(s): lower train.ray.workers or the resources per "
                "worker, free the cluster, or add nodes"
            ) from None

    def run(self, method: Callable[..., Any], *args: Any, timeout: float | None = None, ranks: list[int] | None = None,
            **kwargs: Any) -> list[Any]:  # fmt: skip
        """Broadcast: call `method` (a worker method by reference) on every rank (or `ranks`) with the same
        arguments; results in rank order."""
        name = method_name(method)
        workers = self.workers if ranks is None else [self.workers[r] for r in ranks]
        return self._get([w.call.remote(name, *args, **kwargs) for w in workers], timeout)

    def scatter(self, method: Callable[..., Any], shares: list[Any], *args: Any, timeout: float | None = None,
                **kwargs: Any) -> list[Any]:  # fmt: skip
        """Call `method` on rank r with `shares[r]` as first argument (then the common ones); results in rank order."""
        if len(shares) != len(self.workers):
            raise ValueError(f"{len(shares)} shares for {len(self.workers)} workers")
        name = method_name(method)
        calls = [w.call.remote(name, share, *args, **kwargs) for w, share in zip(self.workers, shares, strict=True)]
        return self._get(calls, timeout)

    def _get(self, refs: list[Any], timeout: float | None) -> list[Any]:
        """Gather; a dead actor, or a collective failing (`CollectiveError`, by type), becomes WorkerLostError."""
        try:
            pending = list(refs)
            while pending:  # fail at the first error: a peer of a dead rank would wait for its collective timeout
                ready, pending = ray.wait(pending, num_returns=1, timeout=timeout)
                if not ready:
                    raise ray.exceptions.GetTimeoutError(f"no answer within {timeout:.0f} s")
                ray.get(ready[0])
            return ray.get(refs)
        except LOST as exc:
            raise WorkerLostError(f"a training worker was lost or stopped answering: {exc}") from exc
        except ray.exceptions.RayTaskError as exc:
            dead = self.dead_ranks()
            if dead:
                raise WorkerLostError(f"training worker rank(s) {dead} died; a peer failed with: {exc}") from exc
            if isinstance(exc.cause, CollectiveError):
                raise WorkerLostError(f"a collective between the training workers failed: {exc.cause}") from exc
            # the worker's own error and message, not Ray's remote traceback: a user error or a full/read-only disk
            # (permanent) or an unreachable scorer (ScorerUnavailableError, a ConnectionError: transient, retried)
            if isinstance(exc.cause, UserError | ConnectionError) or is_permanent(exc.cause):
                raise exc.cause from exc
            raise

    def dead_ranks(self, timeout: float = 10) -> list[int]:
        dead = []
        for rank, worker in enumerate(self.workers):
            try:
                ray.get(worker.__ray_ready__.remote(), timeout=timeout)
            except Exception:
                dead.append(rank)
        return dead

    def close(self) -> None:
        for worker in self.workers:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(worker)
        self.workers = []
        remove_placement_group(self.placement_group)

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _resources(resources: dict[str, float], names: dict[str, float]) -> str:
    """`{CPU: 2, GPU: 0}`: the resources of `names` (a bundle's), missing ones as 0."""
    return "{" + ", ".join(f"{name}: {float(resources.get(name, 0)):g}" for name in names) + "}"


__all__ = ["LOST", "PlacementError", "TorchWorker", "WorkerGroup", "WorkerLostError"]
