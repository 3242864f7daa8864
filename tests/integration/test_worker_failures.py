"""How a worker group classifies failures, by type and never by message text (a real local Ray, 2 CPUs): a worker
lost while the group starts is a retryable WorkerLostError (it was a bare ActorDiedError that the round task did not
retry); a collective that fails between live workers is a typed CollectiveError -> WorkerLostError; an error of the
computation whose message happens to say "timed out" stays that error."""

from __future__ import annotations

import os
import time

import pytest
import torch

from unirl_core.distributed.rank import CollectiveError, TorchWorker, raised_in_collective

pytestmark = pytest.mark.slow


class DiesInSetup(TorchWorker):  # defined here: Ray pickles it by value
    def setup(self, rank, *args, **kwargs):
        if rank == 1:
            os._exit(1)  # the process is gone mid-start, as a kill during the group's start leaves it
        return super().setup(rank, *args, **kwargs)


class Failing(TorchWorker):
    def scorer_timeout(self) -> None:
        raise RuntimeError("the reward server timed out after 30 s")  # the computation's error, not the cluster's

    def lonely_all_reduce(self) -> None:
        if self.rank == 0:  # rank 1 never joins: rank 0's collective times out inside torch.distributed
            torch.distributed.all_reduce(torch.ones(1))


def test_a_worker_lost_while_the_group_starts_is_retryable(ray_local):
    import ray

    from unirl_core.distributed.worker_group import WorkerGroup, WorkerLostError

    with pytest.raises(WorkerLostError):  # the round task retries it (tasks/train.py: transient)
        WorkerGroup(world_size=2, worker_cls=DiesInSetup)
    deadline = time.monotonic() + 30  # the group was torn down: its CPUs come back (Ray frees them asynchronously)
    while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 2


def test_collective_failures_are_told_from_the_computations_errors_by_type(ray_local):
    from unirl_core.distributed.worker_group import WorkerGroup, WorkerLostError

    with WorkerGroup(world_size=2, worker_cls=Failing, collective_timeout_s=3) as group:
        with pytest.raises(RuntimeError) as own:
            group.run(Failing.scorer_timeout)
        assert not isinstance(own.value, WorkerLostError) and "timed out" in str(own.value)
        with pytest.raises(WorkerLostError) as collective:
            group.run(Failing.lonely_all_reduce)
        assert isinstance(collective.value.__cause__.cause, CollectiveError)


def test_raised_in_collective_reads_the_type_and_the_place():
    """torch's typed errors count; a RuntimeError counts by where it was raised (gloo's C++ collectives raise plain
    RuntimeErrors that surface in torch/distributed: the Ray test above), never by what its message says."""
    import torch.distributed as dist

    assert raised_in_collective(dist.DistBackendError("anything"))
    try:
        raise RuntimeError("Timed out waiting 5000ms for recv operation to complete (gloo)")  # raised here
    except RuntimeError as exc:
        assert not raised_in_collective(exc)
