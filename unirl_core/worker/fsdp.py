"""FSDP2 for every family from one function: `fully_shard` each repeated block the family names, then the root.

Model code never mentions FSDP: a family lists its blocks (`family.blocks()`), and this module shards them.
LoRA is injected before wrapping (the family does it at build time), so the LoRA weights are sharded with their
blocks. Activation checkpointing uses the model's own gradient checkpointing (diffusers).

Mixed precision: the trained parameters (LoRA, or the whole denoiser) are float32 master weights, so are their
gradients and AdamW's state, whatever `train.model.dtype` is (a bf16 weight has 8 significant bits: an update
smaller than ~1/256 of the weight, e.g. lr 1e-5 on a weight of 0.01, rounds away). The frozen weights stay in the
model dtype. The compute dtype is bf16 when the model is bfloat16 (on CPU too) or, with `fsdp.mixed_precision: auto`,
on CUDA, or with `bf16`: FSDP2 casts the parameters to bf16 for the forward and backward and reduces gradients in
fp32 (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`). Log-probs are computed in float32 from the
float32 velocity. A float32 model on CPU computes in float32 throughout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist


def mixed_precision_policy(setting: str, device: torch.device, model_dtype: torch.dtype = torch.float32):
    """FSDP2's policy: bf16 compute with fp32 gradient reduction for a bf16 model (any device), for `bf16`, and for
    `auto` on CUDA; otherwise none (compute in the parameters' own dtype)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    bf16 = setting == "bf16" or model_dtype == torch.bfloat16 or (setting == "auto" and device.type == "cuda")
    if not bf16:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


@torch.no_grad()
def master_weights_fp32(module: torch.nn.Module) -> int:
    """Every trained parameter of `module` in float32 (frozen ones keep their dtype); returns how many it cast."""
    cast = 0
    for parameter in module.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
            cast += 1
    return cast


def parallelize(module: torch.nn.Module, blocks: list[torch.nn.Module], device: torch.device, fsdp_config,
                model_dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
    """Shard `module` over all ranks of the default process group, block by block, in place, its trained
    parameters as float32 master weights (`model_dtype`: the frozen weights' dtype, which picks the compute one).
    One rank computing in the parameters' own dtype is left unwrapped: sharding over one rank holds the same
    weights, and FSDP2's unshard and reduce hooks only cost time (a fifth of a tiny model's step on CPU)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    master_weights_fp32(module)
    policy = mixed_precision_policy(fsdp_config.mixed_precision, device, model_dtype)
    if fsdp_config.activation_checkpointing:
        enable = getattr(module, "enable_gradient_checkpointing", None)  # diffusers; transformers' name below
        (enable or module.gradient_checkpointing_enable)()
    if dist.get_world_size() == 1 and policy == MixedPrecisionPolicy():
        return
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)


def local_fraction(module: torch.nn.Module) -> dict[str, int]:
    """How many parameter elements this rank holds vs the full model's (a sharded rank holds about 1/world)."""
    from torch.distributed.tensor import DTensor

    local = full = 0
    for parameter in module.parameters():
        if isinstance(parameter, DTensor):
            local += parameter.to_local().numel()
            full += parameter.numel()
        else:
            local += parameter.numel()
            full += parameter.numel()
    return {"local_elements": local, "full_elements": full}


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank must call it); plain tensors pass through."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


@contextlib.contextmanager
def gathered(module: torch.nn.Module, enabled: bool = True) -> Iterator[None]:
    """Within the block, `module`'s FSDP2 units keep their parameters gathered after a forward (FSDP2's
    `reshard_after_forward=False`): one all-gather per unit for the block's forwards and backwards, not one per
    forward and one per backward; every unit is resharded at its end (before an optimizer step: the gathered
    copies would be stale). The same values are gathered either way: the numbers do not change. A no-op unsharded."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)] if enabled else []
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)
