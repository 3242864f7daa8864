"""Flow-GRPO-Fast (yifan123/flow_grpo, config/base.py: `sde_window_size` 2, range (0, num_steps)): GRPO whose
stochastic and trained steps are a random 2-step window per RL step (drawn from (seed, step): every sample of the
step shares it), ODE steps elsewhere; the same PPO-clip loss on fewer training forwards.
"""

from __future__ import annotations

from typing import Literal

from unirl_core.algorithms.config import SDEWindowConfig
from unirl_core.algorithms.grpo import GRPO, GRPOConfig


class FlowGRPOFastConfig(GRPOConfig):
    name: Literal["flow_grpo_fast"] = "flow_grpo_fast"  # type: ignore[assignment]
    """GRPO on a random 2-step SDE window, ODE elsewhere."""

    sde_window: SDEWindowConfig | None = SDEWindowConfig(mode="random", size=2)
    """Flow-GRPO-Fast's window: 2 steps placed at random per RL step (a partial window in the recipe merges in)."""


class FlowGRPOFast(GRPO):
    config_class = FlowGRPOFastConfig
