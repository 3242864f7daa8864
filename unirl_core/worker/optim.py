"""What every domain's train stack shares: AdamW over float32 master weights, the LR schedule's factor, gradient
clipping across FSDP2 shards, and the error a non-finite loss or gradient raises."""

from __future__ import annotations

import math

import torch

from unirl_core.errors import UserError


class NonFiniteError(UserError, RuntimeError):
    """A non-finite loss or gradient: the optimizer step is skipped and the run stops, naming step and samples."""


def lr_factor(step: int, total: int, schedule: str, warmup: int) -> float:
    """Multiplier of the base learning rate at optimizer step `step` of `total` (linear warm-up, then the schedule)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """Clip by the global norm, across shards when the parameters are FSDP2 DTensors (every rank gets the same)."""
    from unirl_core.worker.fsdp import full_value

    return full_value(torch.nn.utils.clip_grad_norm_(parameters, max_norm))


def adamw(parameters: list[torch.nn.Parameter], lr: float) -> torch.optim.AdamW:
    """AdamW (no weight decay) over float32 master weights; its state takes their dtype. A bf16 weight has 8
    significant bits: an update below ~1/256 of the weight (lr 1e-5 on a weight of 0.01) would round away."""
    low = sorted({str(p.dtype) for p in parameters if p.dtype != torch.float32})
    if low:
        raise ValueError(f"trained parameters in {low}: the optimizer needs float32 master weights (fsdp.parallelize)")
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)


def optimizer_step(optimizer, scheduler, parameters, max_norm: float, metrics: dict[str, list[float]], step: int):
    """Clip the accumulated gradients, refuse a non-finite norm, step the optimizer and the LR schedule; `metrics`
    gets the step's `lr` and `grad_norm`."""
    grad_norm = clip_gradients(parameters, max_norm)
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteError(f"step {step}: non-finite gradient norm; optimizer step skipped")
    metrics.setdefault("lr", []).append(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
    metrics.setdefault("grad_norm", []).append(grad_norm.item())
