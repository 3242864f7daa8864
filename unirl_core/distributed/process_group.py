"""torch.distributed set-up inside a worker: the backend follows the worker's own device (gloo on CPU, nccl on a GPU),
never whether the node has GPUs: Ray 2.60 leaves every GPU visible to an actor that asked for none, and nccl cannot
reduce that CPU worker's tensors."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def default_backend(device: torch.device | str) -> str:
    """The backend of a worker computing on `device`: nccl for a CUDA device, gloo otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def resolve_backend(setting: str | None, device: torch.device | str) -> str:
    """`train.ray.backend`: an explicit `gloo` / `nccl` wins; `auto` (or None) follows the worker's device."""
    return setting if setting and setting != "auto" else default_backend(device)


def open_store(host: str, world_size: int, timeout_s: int = 300) -> dist.TCPStore:
    """Rank 0's rendezvous store, listening on `host` alone (torch's own listener would take every interface) and
    on a port the OS assigns as it binds: a port probed free and bound later can be taken by another process in
    between (EADDRINUSE). `.port` is where the other ranks meet it."""
    timeout = timedelta(seconds=timeout_s)
    listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    return dist.TCPStore(host, listener.getsockname()[1], world_size, is_master=True, wait_for_workers=False,
                         timeout=timeout, master_listen_fd=listener.detach())  # fmt: skip


def init_process_group(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    backend: str | None = None,
    timeout_s: int = 300,
    store: dist.Store | None = None,
    device: torch.device | str = "cpu",
) -> str:
    """Join the group of `world_size` ranks rendezvousing at master_addr:master_port (rank 0 passes the `store` it
    opened there); `backend` None: the one of this worker's `device`. Returns the backend."""
    backend = resolve_backend(backend, device)
    timeout = timedelta(seconds=timeout_s)
    store = store or dist.TCPStore(master_addr, master_port, world_size, is_master=False, timeout=timeout)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return backend
