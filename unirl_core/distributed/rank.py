"""One rank of a worker group, and how the controller names a rank's methods.

`TorchWorker` is the base class of every rank: Ray runs it as an actor (`WorkerGroup`), `LocalGroup` calls it in
this process. The controller calls a method by reference (`group.run(TrainWorker.build, ...)`), never by a string,
so a call site and its definition stay linked.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from unirl_core.distributed.process_group import init_process_group, open_store

DISTRIBUTED = Path(dist.__file__).resolve().parent  # torch/distributed/: collectives, FSDP2's communication, stores


class CollectiveError(RuntimeError):
    """A torch.distributed operation failed on this rank (a collective timed out, its peer is gone, the store is
    unreachable): a failure of the cluster, not of the computation. Raised by `TorchWorker.call` from the original
    error (chained), so the controller classifies it by type."""


def raised_in_collective(exc: BaseException) -> bool:
    """Whether `exc` was raised by torch.distributed itself: a `torch.distributed.DistError`, or a RuntimeError whose
    innermost frame is in torch/distributed (gloo raises plain RuntimeErrors from its C++ collectives, which surface
    at the Python call that waited on them). An error of the model's or a reward's code is raised elsewhere."""
    if isinstance(exc, dist.DistError):
        return True
    frames = traceback.extract_tb(exc.__traceback__)
    return (
        type(exc) is RuntimeError and bool(frames) and Path(frames[-1].filename).resolve().is_relative_to(DISTRIBUTED)
    )


class TorchWorker:
    """One rank. Subclass it for real work; every public method can be called on the whole group."""

    store = None  # rank 0's rendezvous store, kept alive with the process group
    gpus: float = 0  # in-process (`LocalGroup`): the recipe's gpus_per_worker; a Ray actor reads its own assignment

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Method `name` with the arguments: how a worker group calls every method, so that a failure of a
        torch.distributed operation leaves the rank as a `CollectiveError` whatever the method."""
        try:
            return getattr(self, name)(*args, **kwargs)
        except RuntimeError as exc:
            if raised_in_collective(exc):
                raise CollectiveError(f"{type(exc).__name__}: {exc}") from exc
            raise

    def rendezvous_address(self, world_size: int, timeout_s: int = 300) -> tuple[str, int]:
        """Rank 0, before `setup`: open the process group's store on this node; returns where the ranks meet."""
        import ray

        return self.open_rendezvous(ray.util.get_node_ip_address(), world_size, timeout_s)

    def open_rendezvous(self, address: str, world_size: int, timeout_s: int = 300) -> tuple[str, int]:
        self.store = open_store(address, world_size, timeout_s)
        return address, self.store.port

    def setup(
        self, rank: int, world_size: int, master_addr: str, master_port: int, backend: str | None, timeout_s: int = 300
    ) -> str:
        self.rank, self.world_size = rank, world_size
        store = self.store if rank == 0 else None
        device = self.device_for(self.assigned_gpus())
        return init_process_group(rank, world_size, master_addr, master_port, backend, timeout_s, store, device)

    def assigned_gpus(self) -> float:
        """GPUs this worker was given: a Ray actor's own (`ray.get_gpu_ids()`: Ray 2.60 leaves every GPU visible to
        an actor that asked for none, so `torch.cuda.is_available()` says nothing about it), else `self.gpus`."""
        ray = sys.modules.get("ray")  # not imported: not a Ray actor
        if ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
            return len(ray.get_gpu_ids())
        return self.gpus

    def device_for(self, gpus: float) -> torch.device:
        """This worker's torch device: its Ray-assigned GPU (visible as cuda:0) when it has one, the current CUDA
        device in this process, else the CPU."""
        if not (gpus and torch.cuda.is_available()):
            return torch.device("cpu")
        ray = sys.modules.get("ray")  # not imported: not a Ray actor (`unirl train --local` needs no Ray)
        in_ray = ray is not None and ray.is_initialized() and ray.get_gpu_ids()
        return torch.device("cuda", 0 if in_ray else torch.cuda.current_device())

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None


def method_name(method: Callable[..., Any]) -> str:
    """The name of a worker method given by reference (`TrainWorker.rollout`)."""
    name = getattr(method, "__name__", None)
    if not callable(method) or name is None or "." not in getattr(method, "__qualname__", ""):
        raise TypeError(f"{method!r}: call a worker method by reference, e.g. group.run(TrainWorker.build, ...)")
    return name
