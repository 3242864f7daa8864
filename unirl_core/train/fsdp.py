"""FSDP2 for every family from one function: `fully_shard` each repeated block the adapter names, then the root.

Model code never mentions FSDP: an adapter lists its blocks (`adapter.blocks()`), and this module shards them.
LoRA is injected before wrapping (the adapter does it at build time), so the LoRA weights are sharded with their
blocks. On CUDA the default mixed precision keeps bf16 parameters for compute and reduces gradients in fp32; on
CPU (gloo) everything stays fp32. Activation checkpointing uses the model's own gradient checkpointing (diffusers).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def mixed_precision_policy(setting: str, device: torch.device):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    bf16 = setting == "bf16" or (setting == "auto" and device.type == "cuda")
    if not bf16:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def parallelize(module: torch.nn.Module, blocks: list[torch.nn.Module], device: torch.device, fsdp_config) -> None:
    """Shard `module` over all ranks of the default process group, block by block, in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_precision_policy(fsdp_config.mixed_precision, device)
    if fsdp_config.activation_checkpointing:
        module.enable_gradient_checkpointing()
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
