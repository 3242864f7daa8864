"""An in-process group of one rank: `unirl train --local` drives the same controller and the same worker class as
a Ray round, with no Ray (one loop, two transports).

torch.distributed is initialized in this process with world size 1 (gloo on 127.0.0.1, nccl when `gpus` puts the
rank on a GPU), so FSDP2, DCP checkpoints and the collectives run exactly the code they run on N ranks; a 1-worker
Ray round and `--local` give the same numbers. `close()` ends the process group and restores torch's thread count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from unirl_core.distributed.rank import TorchWorker, method_name


class LocalGroup:
    """`worker_cls` as rank 0 of 1 in this process; `run`/`scatter` as `WorkerGroup`'s (timeouts are not enforced
    inside a call: the controller checks its deadline between steps)."""

    def __init__(self, worker_cls: type[TorchWorker] = TorchWorker, backend: str | None = None,
                 collective_timeout_s: int = 300, gpus: float = 0):  # fmt: skip
        self.threads = torch.get_num_threads()
        self.worker = worker_cls()
        self.worker.gpus = gpus  # the rank's device (and so its backend) as the recipe's gpus_per_worker says
        address, port = self.worker.open_rendezvous("127.0.0.1", 1, collective_timeout_s)
        self.backends = [self.worker.setup(0, 1, address, port, backend, collective_timeout_s)]

    def run(self, method: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        return [self.worker.call(method_name(method), *args, **kwargs)]

    def scatter(self, method: Callable[..., Any], shares: list[Any], *args: Any, timeout: float | None = None,
                **kwargs: Any) -> list[Any]:  # fmt: skip
        if len(shares) != 1:
            raise ValueError(f"{len(shares)} shares for 1 worker")
        return [self.worker.call(method_name(method), shares[0], *args, **kwargs)]

    def close(self) -> None:
        self.worker.teardown()
        torch.set_num_threads(self.threads)

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
