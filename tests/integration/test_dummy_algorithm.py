"""An algorithm is one module: tests/support/dummy_algorithm.py, named in the recipe by `module:Class`, validated
by its own config class, trained through the one controller (`--local` transport), checkpointed with its own state
and resumed bitwise, and refused where its capabilities say so; no unirl file names it."""

from __future__ import annotations

import pytest
import torch
from local_training import comparable, train_locally

from unirl_core.config import RecipeError, load_recipe

pytestmark = pytest.mark.slow

NAME = "dummy_algorithm:ScaledGRPO"


class Killed(Exception):
    """Stands in for a kill after a step was logged."""


def config(**overrides):
    sets = {"train.algorithm.name": NAME, "train.algorithm.gain": 0.5, "train.steps": 4,
            "train.checkpoint_every": 1, "train.eval_every_rounds": 0, **overrides}  # fmt: skip
    return load_recipe("demo", [f"{k}={v}" for k, v in sets.items()]).train


def test_the_algorithm_trains_checkpoints_its_state_and_resumes_bitwise(tmp_path, mlflow_uri):
    train = config()
    assert type(train.algorithm).__name__ == "ScaledGRPOConfig" and train.algorithm.gain == 0.5
    straight = train_locally(train, tmp_path / "a")
    assert [row["advantage_scale"] for row in straight][0] == 1.0  # no step seen yet
    assert len({row["advantage_scale"] for row in straight}) > 1  # the running state moved
    assert all(row["grad_norm"] > 0 for row in straight) and straight[0]["ratio_mean"] == 1.0

    def kill_after_step_1(row):
        if row["step"] == 2:
            raise Killed

    first: list[dict] = []
    with pytest.raises(Killed):  # steps 0-1 committed (with the running scale), step 2 lost
        train_locally(train, tmp_path / "b", on_step=lambda row: (first.append(row), kill_after_step_1(row)))
    resumed = train_locally(train, tmp_path / "b")
    assert [row["step"] for row in resumed] == [2, 3]
    assert comparable(first[:2] + resumed) == comparable(straight)  # the scale came back from the checkpoint
    assert resumed[0]["advantage_scale"] != 1.0  # restored, not restarted (a fresh scale is 1 at its first step)
    assert not torch.isnan(torch.tensor([row["loss"] for row in resumed])).any()


def test_its_own_config_and_capabilities_are_checked():
    with pytest.raises(RecipeError) as bad_key:
        config(**{"train.algorithm.gian": 2})
    assert "train.algorithm.gian" in str(bad_key.value) and "did you mean 'gain'" in str(bad_key.value)
    with pytest.raises(RecipeError) as updates:  # supports_multi_update = False
        config(**{"train.algorithm.num_updates_per_batch": 2})
    assert "train.algorithm.num_updates_per_batch" in str(updates.value) and "on-policy" in str(updates.value)
    with pytest.raises(RecipeError) as unknown:
        config(**{"train.algorithm.name": "dummy_algorithm:Nothing"})
    assert "cannot be imported" in str(unknown.value)
