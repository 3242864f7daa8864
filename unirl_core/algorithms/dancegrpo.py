"""DanceGRPO (arXiv 2505.07818; XueZeyue/DanceGRPO, FLUX): GRPO with DanceGRPO's SDE (std eta = 0.3 at every noise
level) on every step, a random int(0.6 n) of the n - 1 first steps trained per sample (the last step never),
siblings of a group sharing their initial noise, advantages with torch's N - 1 std and eps 1e-8.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from unirl_core.algorithms.grpo import GRPO, GRPOConfig


class DanceGRPOConfig(GRPOConfig):
    name: Literal["dancegrpo"] = "dancegrpo"  # type: ignore[assignment]
    """GRPO with DanceGRPO's SDE (eta 0.3) on every step, a random 60% of the steps trained per sample."""

    sde_type: str = "dance"
    """DanceGRPO's constant-std SDE."""

    eta: Annotated[float, Field(ge=0)] = 0.3
    """DanceGRPO's eta."""

    timestep_fraction: Annotated[float, Field(gt=0, le=1)] = 0.6
    """DanceGRPO: int(0.6 n) steps trained per sample."""

    step_rounding: Literal["round", "floor"] = "floor"
    """DanceGRPO: int(n x timestep_fraction)."""

    train_timesteps: Literal["first", "random"] = "random"
    """DanceGRPO: a random subset of steps per sample."""

    untrained_steps: Literal["ode", "sde"] = "sde"
    """DanceGRPO: every step samples with the SDE."""

    exclude_last_step: bool = True
    """DanceGRPO: the last step is never trained."""

    std_ddof: Annotated[int, Field(ge=0, le=1)] = 1
    """DanceGRPO: torch's .std() (N - 1)."""

    adv_eps: Annotated[float, Field(gt=0)] = 1e-8
    """DanceGRPO: 1e-8 added to the std."""


class DanceGRPO(GRPO):
    config_class = DanceGRPOConfig
    shares_group_noise = True
