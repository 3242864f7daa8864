"""CUDA determinism mode (`train.deterministic: true`): the same inputs give the same bits on every run.

What it costs (on GPU; on CPU the kernels are deterministic already and nothing changes but the flags):
- `CUBLAS_WORKSPACE_CONFIG=:4096:8`: cuBLAS gives bitwise-repeatable results only when its workspace is fixed
  (several streams sharing one pool may otherwise pick other reduction orders; NVIDIA's cuBLAS notes, "Results
  reproducibility"): 8 buffers of 4096 KiB, 32 MiB of device memory per cuBLAS handle. It is read when the handle
  is created, so it is set at rank setup, before the model is built and before the first matmul.
- `torch.use_deterministic_algorithms(True)`: atomics-based kernels (scatter/index_add backward, some
  interpolation and convolution backward passes) switch to slower ordered ones, and an op with no deterministic
  implementation raises instead of running. The denoiser's attention (`scaled_dot_product_attention`) keeps the
  flash and memory-efficient kernels, whose backward then accumulates dQ in a fixed order (slower), and loses the
  cuDNN attention backend (PyTorch's notes on randomness, "CUDA Scaled Dot Product Attention").
- cuDNN: `benchmark` off (no autotuning: the first-found algorithm, often slower), `deterministic` on.
The slowdown is not measured yet (no GPU was lent when this was written): run benchmarks/rl_throughput.py --full
with and without it. Bitwise equality also needs the same GPU model, driver, library versions and world size.
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
