"""MixGRPO (arXiv 2507.21802; Tencent-Hunyuan/MixGRPO, FLUX scripts) and MixGRPO-Flash: GRPO on a 4-step SDE window
that slides 1 step every 25 RL steps (cycling back to the start), ODE steps elsewhere, siblings of a group sharing
their initial noise, the last denoising step never stochastic, advantages with torch's N - 1 std and eps 1e-8.
MixGRPO-Flash moves the window every 20 RL steps and runs the ODE steps after it on DPM-Solver++ 2M over 0.4 of
them (`sde_window.post_compress`, `ode_solver`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from unirl_core.algorithms.config import SDEWindowConfig
from unirl_core.algorithms.grpo import GRPO, GRPOConfig


class MixGRPOConfig(GRPOConfig):
    name: Literal["mixgrpo"] = "mixgrpo"  # type: ignore[assignment]
    """GRPO on a sliding 4-step window (moves every 25 RL steps), shared group noise."""

    sde_window: SDEWindowConfig | None = SDEWindowConfig(mode="sliding", size=4, shift_every=25, stride=1, end=-1)
    """MixGRPO's window: 4 steps, 1 step further every 25 RL steps, cut at n - 2 (its `max_timesteps`; 25 steps:
    positions 0-23, the last windows shrinking) (a partial window in the recipe merges in)."""

    exclude_last_step: bool = True
    """MixGRPO: the last denoising step is never in the window."""

    std_ddof: Annotated[int, Field(ge=0, le=1)] = 1
    """MixGRPO: torch's .std() (N - 1)."""

    adv_eps: Annotated[float, Field(gt=0)] = 1e-8
    """MixGRPO: 1e-8 added to the std."""


class MixGRPO(GRPO):
    config_class = MixGRPOConfig
    shares_group_noise = True


class MixGRPOFlashConfig(MixGRPOConfig):
    name: Literal["mixgrpo_flash"] = "mixgrpo_flash"  # type: ignore[assignment]
    """MixGRPO with the ODE steps after the window thinned to 0.4 and run with DPM-Solver++ 2M."""

    sde_window: SDEWindowConfig | None = SDEWindowConfig(
        mode="sliding", size=4, shift_every=20, stride=1, end=-1, post_compress=0.4
    )
    """MixGRPO-Flash's window: 4 steps moving every 20 RL steps; the ODE after it over 0.4 of its steps."""

    ode_solver: Literal["euler", "dpm2m"] = "dpm2m"
    """MixGRPO-Flash: DPM-Solver++ 2M after the window."""


class MixGRPOFlash(MixGRPO):
    config_class = MixGRPOFlashConfig
