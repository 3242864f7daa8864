"""Per-sample trained steps on two FSDP2 ranks: ranks group their samples into different numbers of forwards
(DanceGRPO's random steps, DiffusionNFT's random grid steps), while FSDP2's forwards and backwards are collectives run
in the same order everywhere. Without padding to the busiest rank this deadlocks (gloo: "Received data size doesn't
match expected size"). Two spawned processes, gloo, real FSDP2 sharding of the tiny SD3: the step must finish and
equal one rank training all four samples. Both ranks build the tiny model at once in a fresh workspace (transformers
writes weights on rank 0 only once a process group exists: the folder must still be whole)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from two_ranks import one_step, train_rank

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NAMES = ["dancegrpo", "diffusion_nft"]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> str:
    """One spawn of two ranks running a step of each algorithm (one process start and tiny-model build for both)."""
    folder = tmp_path_factory.mktemp("two-ranks")
    out = str(folder / "rank0")
    mp.spawn(train_rank, args=(2, free_port(), NAMES, str(folder / "home"), out), nprocs=2, join=True)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_two_ranks_with_per_sample_steps_train_as_one(name, two_ranks):
    two = load_file(f"{two_ranks}-{name}.safetensors")
    two_norm = json.loads(Path(f"{two_ranks}-{name}.json").read_text())["grad_norm"]
    weights, grad_norm = one_step(name)
    assert grad_norm == pytest.approx(two_norm, rel=1e-4)
    assert all(torch.allclose(w, two[f"{i:04d}"], atol=1e-5) for i, w in enumerate(weights))


@pytest.mark.parametrize("name", NAMES)
def test_gathering_once_per_phase_gives_the_numbers_of_gathering_per_forward(name, two_ranks):
    """`fsdp.reshard_after_forward: false` (one all-gather per unit per rollout and per optimizer step) against true
    (FSDP2's default: one per forward and per backward): the same gathered values, so bitwise the same step."""
    once, every = (load_file(f"{two_ranks}-{name}{suffix}.safetensors") for suffix in ("", "-resharded"))
    assert once.keys() == every.keys() and all(torch.equal(once[k], every[k]) for k in once)
    norms = [
        json.loads(Path(f"{two_ranks}-{name}{suffix}.json").read_text())["grad_norm"] for suffix in ("", "-resharded")
    ]
    assert norms[0] == norms[1]
