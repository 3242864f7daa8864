"""Flow-GRPO-Fast (yifan123/flow_grpo 54809b5, config/base.py: `sde_window_size` 2, `sde_window_range` (0, 10)):
GRPO whose stochastic and trained steps are a random 2-step window per RL step (drawn from (seed, step): every sample
of the step shares it), ODE steps elsewhere; the same PPO-clip loss on fewer training forwards. The preset's range is
every step of the recipe's n: base.py's fixed (0, 10) is exactly that for flow_grpo's 10-step SD3.5 runs, and would
not fit a shorter schedule; its fast configs narrow it to (0, n // 2), as `sd35_medium_flow_grpo_fast` does
(`sde_window: {end: 5}`).
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
