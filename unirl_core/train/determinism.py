"""CUDA determinism mode (`train.deterministic: true`): the same inputs give the same bits on every run.

What it costs (on GPU; on CPU the kernels are deterministic already and nothing changes but the flags):
- `CUBLAS_WORKSPACE_CONFIG=:4096:8`: cuBLAS keeps 8 workspaces of 4 MiB per stream (a few tens of MiB per process)
  so it stops picking split-K reductions whose order varies; it must be set before the process's first cuBLAS call
  (the handle reads it once), which is why this runs at rank setup, before the model is built.
- `torch.use_deterministic_algorithms(True)`: atomics-based kernels (scatter/index_add backward, some
  interpolation and convolution backward passes) switch to slower ordered ones, and an op with no deterministic
  implementation raises instead of running.
- cuDNN: `benchmark` off (no autotuning: the first-found algorithm, often slower), `deterministic` on.
Expect a step to run roughly 5-20% slower on a transformer denoiser (attention and matmul dominate); measure with
benchmarks/rl_throughput.py.
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"


def apply_determinism(enabled: bool) -> None:
    """Make this process's CUDA (and CPU) kernels deterministic when `enabled`; a no-op otherwise (the defaults
    stay, so a run without the key keeps its speed)."""
    if not enabled:
        return
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
