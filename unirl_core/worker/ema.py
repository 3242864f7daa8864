"""EMA shadow of the trained parameters (sharded like them under FSDP2), swapped in for evaluation."""

from __future__ import annotations

import contextlib

import torch


class EMA:
    def __init__(self, parameters: list[torch.nn.Parameter], decay: float, interval: int = 1):
        self.parameters, self.decay, self.interval = list(parameters), decay, interval
        self.shadow = [p.detach().clone() for p in self.parameters]

    @torch.no_grad()
    def update(self, step: int, decay: float | None = None) -> None:
        """After optimizer step `step`: shadow <- decay x shadow + (1 - decay) x weights, every `interval` steps
        (`decay`: this update's, in place of the fixed one)."""
        if (step + 1) % self.interval:
            return
        decay = self.decay if decay is None else decay
        for shadow, parameter in zip(self.shadow, self.parameters, strict=True):
            shadow.lerp_(parameter.detach(), 1.0 - decay)

    @contextlib.contextmanager
    @torch.no_grad()
    def applied(self):
        """The EMA weights in place of the trained ones inside the block."""
        saved = [p.detach().clone() for p in self.parameters]
        for parameter, shadow in zip(self.parameters, self.shadow, strict=True):
            parameter.copy_(shadow)
        try:
            yield
        finally:
            for parameter, value in zip(self.parameters, saved, strict=True):
                parameter.copy_(value)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The shadow tensors themselves: DCP saves them and loads into them in place."""
        return {f"{i:05d}": shadow for i, shadow in enumerate(self.shadow)}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for i, shadow in enumerate(self.shadow):
            if state[f"{i:05d}"] is not shadow:  # DCP filled the shadow in place already
                shadow.copy_(state[f"{i:05d}"])

    @torch.no_grad()
    def reset(self) -> None:
        """The shadow <- the current weights (a new stage starts its average from the loaded weights)."""
        for shadow, parameter in zip(self.shadow, self.parameters, strict=True):
            shadow.copy_(parameter.detach())
