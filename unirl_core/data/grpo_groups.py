"""Rollout groups: each prompt of a batch repeated `samples_per_prompt` times, late, in the rollout.

Prompts are never pre-duplicated in the data. A batch of P prompts becomes P x K samples; the K siblings of a
prompt share a `group_id` (the GRPO group), sit next to each other, and are named `prompt:<gid>:sample:<j>`.
Group ids are global across a run when the caller passes `first_group_id = step x prompts_per_rollout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from unirl_core.data.prompts import PromptExample


@dataclass(frozen=True)
class RolloutSample:
    example: PromptExample
    group_id: int
    sample_index: int  # j: 0..samples_per_prompt-1 within the group

    @property
    def sample_id(self) -> str:
        return f"prompt:{self.group_id}:sample:{self.sample_index}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.example.to_dict(), "group_id": self.group_id, "sample_id": self.sample_id}


def expand_groups(batch: list[PromptExample], samples_per_prompt: int, first_group_id: int = 0) -> list[RolloutSample]:
    """P prompts -> P x K samples, siblings adjacent: [g0 s0, g0 s1, ..., g1 s0, ...]."""
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    return [
        RolloutSample(example, first_group_id + g, j)
        for g, example in enumerate(batch)
        for j in range(samples_per_prompt)
    ]
