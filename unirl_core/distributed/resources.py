"""What a worker group asks of its cluster, and whether the cluster has it: checked before any actor starts.

    asked = workers x cpus_per_worker CPUs, workers x gpus_per_worker GPUs   e.g. 8 x 1 = 8 GPUs

A local Ray started for the round is as big as this machine (`this_machine`: its CPUs, `torch.cuda.device_count()`
GPUs; Ray itself would accept `num_gpus=8` on a machine without GPUs and the workers would train on the CPU). An
existing cluster (`train.ray.address`) is asked after connecting (`ray.cluster_resources()`). No Ray import here:
`trainer.plan.validate` checks the machine before any Ray or Prefect work.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from unirl_core.errors import UserError


class ClusterResourcesError(UserError, RuntimeError):
    """The cluster cannot hold the worker group as configured (the message shows the arithmetic); never retried."""


def cluster_address(ray_config) -> str | None:
    """The existing cluster a round joins, or None: a local Ray started for the round."""
    return ray_config.address or os.environ.get("RAY_ADDRESS") or None


def starts_local_ray(ray_config) -> bool:
    """Whether the round starts a local Ray on this machine: no cluster address, and this process is not already
    connected to a Ray (a notebook's or a test session's, which the round then uses as is)."""
    ray = sys.modules.get("ray")  # not imported: not connected
    return not cluster_address(ray_config) and not (ray is not None and ray.is_initialized())


def asked(ray_config) -> dict[str, float]:
    """Global CPUs and GPUs of the worker group."""
    workers = ray_config.workers
    return {"CPU": workers * ray_config.cpus_per_worker, "GPU": workers * ray_config.gpus_per_worker}


def reward_actors_asked(reward_config) -> dict[str, float]:
    """Global CPUs and GPUs of the dedicated reward actors (none when the model rewards are colocated)."""
    from unirl_core.rewards.registry import used_model_rewards

    if reward_config is None or reward_config.placement != "dedicated" or not used_model_rewards(reward_config):
        return {"CPU": 0.0, "GPU": 0.0}
    actors = reward_config.actors
    return {"CPU": actors.workers * actors.cpus_per_worker, "GPU": actors.workers * actors.gpus_per_worker}


def this_machine() -> dict[str, float]:
    """What a local Ray started on this machine can really give: its CPUs and its CUDA devices."""
    import torch

    return {"CPU": float(os.cpu_count() or 1), "GPU": float(torch.cuda.device_count())}


def shortfalls(ray_config, available: Mapping[str, float], where: str, reward_config=None) -> list[str]:
    """One line per resource the group (and the dedicated reward actors of `reward_config`) asks for and `where`
    (e.g. "this machine") lacks; empty when it fits."""
    workers, need, rewards = ray_config.workers, asked(ray_config), reward_actors_asked(reward_config)
    have_cpus, have_gpus = float(available.get("CPU", 0)), float(available.get("GPU", 0))
    lines = []
    for name, unit in (("CPU", "CPUs"), ("GPU", "GPUs")):
        have, total = float(available.get(name, 0)), need[name] + rewards[name]
        if rewards[name] and total > have:
            per_actor = rewards[name] / reward_config.actors.workers
            lines.append(
                f"train.ray asks {need[name]:g} {unit} and train.reward.actors {reward_config.actors.workers} x "
                f"{per_actor:g} = {rewards[name]:g} more, {total:g} {unit} in all, but {where} has {have:g}: lower "
                f"train.reward.actors.workers or {name.lower()}s_per_worker, or set train.reward.placement=colocated"
            )
    if need["GPU"] and not have_gpus:
        lines.append(
            f"train.ray.gpus_per_worker={ray_config.gpus_per_worker:g} asks for GPUs but {where} has none (the "
            "workers would silently train on the CPU): set train.ray.gpus_per_worker=0 to train on CPUs, or run "
            "on a GPU cluster (train.ray.address)"
        )
    elif need["GPU"] > have_gpus:
        lines.append(
            f"train.ray.workers x train.ray.gpus_per_worker = {workers} x {ray_config.gpus_per_worker:g} = "
            f"{need['GPU']:g} GPUs, but {where} has {have_gpus:g}: lower train.ray.workers to "
            f"{int(max(have_gpus - rewards['GPU'], 0) // ray_config.gpus_per_worker)} or add GPUs"
        )
    if need["CPU"] > have_cpus:
        lines.append(
            f"train.ray.workers x train.ray.cpus_per_worker = {workers} x {ray_config.cpus_per_worker:g} = "
            f"{need['CPU']:g} CPUs, but {where} has {have_cpus:g}: lower train.ray.cpus_per_worker (or workers)"
        )
    return lines


def require(ray_config, available: Mapping[str, float], where: str, reward_config=None) -> None:
    """Raise ClusterResourcesError when `where` cannot hold the group (and the dedicated reward actors)."""
    lines = shortfalls(ray_config, available, where, reward_config)
    if lines:
        raise ClusterResourcesError("the worker group does not fit: " + "; ".join(lines))
