"""The transport of a training round: N Ray workers (a local Ray started for the round, or an existing cluster)
or one rank in this process (`local`). Both groups take the same calls, so the controller is one loop."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def worker_group(
    worker_cls: type,
    ray_config,
    record: Path,
    local: bool = False,
    credential_names: Iterable[str] = (),
    reward_config=None,
) -> Iterator:
    """`local`: a `LocalGroup` of `worker_cls` (train.ray.workers must be 1). Otherwise a `WorkerGroup` of
    `ray_config.workers` actors in the cluster of `ray_config.address` (a local Ray started and stopped around it
    when empty, its processes recorded in `record` for the flow's teardown hooks), refused before any actor starts
    when the cluster is too small. `credential_names`: environment variables the recipe reads credentials from on
    the workers (forwarded from this process's environment, never logged). `reward_config`: its dedicated reward
    actors' CPUs and GPUs are added to a local Ray's and to what the cluster must hold."""
    backend = None if ray_config.backend == "auto" else ray_config.backend
    if local:
        from unirl_core.distributed.local_group import LocalGroup

        assert ray_config.workers == 1, "an in-process group has one rank: set train.ray.workers=1"
        with LocalGroup(worker_cls, backend, ray_config.collective_timeout_s, ray_config.gpus_per_worker) as group:
            yield group
        return
    with _ray_group(worker_cls, ray_config, record, backend, credential_names, reward_config) as group:
        yield group


@contextlib.contextmanager
def _ray_group(worker_cls, ray_config, record: Path, backend, credential_names, reward_config) -> Iterator:
    """`worker_group`'s Ray transport: the cluster (started locally when no address), checked, then the actors."""
    from unirl_core.distributed.cluster import ray_cluster
    from unirl_core.distributed.resources import (
        cluster_address,
        require,
        reward_actors_asked,
        starts_local_ray,
        this_machine,
    )
    from unirl_core.distributed.worker_env import worker_env
    from unirl_core.distributed.worker_group import WorkerGroup

    address = cluster_address(ray_config)
    if starts_local_ray(ray_config):
        require(ray_config, this_machine(), "this machine", reward_config)  # Ray would give a local Ray any GPUs
    env = worker_env(ray_config, credential_names, os.environ)
    logger.info("Ray workers get %s", env.describe())  # names only
    rewards = reward_actors_asked(reward_config)
    resources = {"num_cpus": int(math.ceil(ray_config.workers * ray_config.cpus_per_worker + rewards["CPU"])) or 1}
    if ray_config.gpus_per_worker or rewards["GPU"]:
        resources["num_gpus"] = int(math.ceil(ray_config.workers * ray_config.gpus_per_worker + rewards["GPU"]))
    with ray_cluster(address, **resources, record=record) as available:
        where = f"the Ray cluster at {address}" if address else "the Ray cluster"
        require(ray_config, available, where, reward_config)
        with WorkerGroup(
            ray_config.workers, worker_cls, ray_config.cpus_per_worker, ray_config.gpus_per_worker, backend,
            ready_timeout_s=ray_config.placement_timeout_s, collective_timeout_s=ray_config.collective_timeout_s,
            strategy=ray_config.placement, env=env,
        ) as group:  # fmt: skip
            yield group
