"""A sampler is one module: tests/support/dummy_sampler.py, named by `module:Class` in `train.algorithm.sde_type`,
runs every stochastic step of the rollouts and the train stack's re-evaluations through the one loop (`--local`
transport), checkpoints and resumes bitwise; a DDIM family refuses it by its kind; no unirl file names it."""

from __future__ import annotations

import pytest
from local_training import comparable, train_locally

from unirl_core.config import load_recipe

pytestmark = pytest.mark.slow

NAME = "dummy_sampler:TruncatedSDE"


class Killed(Exception):
    """Stands in for a kill after a step was logged."""


def config(**overrides):
    sets = {"train.algorithm.sde_type": NAME, "train.steps": 3, "train.checkpoint_every": 1,
            "train.eval_every_rounds": 0, **overrides}  # fmt: skip
    return load_recipe("demo", [f"{k}={v}" for k, v in sets.items()]).train


def test_the_sampler_rolls_out_trains_and_resumes_bitwise(tmp_path, mlflow_uri):
    train = config()
    straight = train_locally(train, tmp_path / "a")
    plain = train_locally(config(**{"train.algorithm.sde_type": "sde", "train.steps": 1}), tmp_path / "plain")
    assert straight[0]["ratio_mean"] == 1.0 and all(row["grad_norm"] > 0 for row in straight)
    assert straight[0]["reward_mean"] != plain[0]["reward_mean"]  # its own noise scale reached the images

    def kill_at_step_2(row):
        if row["step"] == 2:
            raise Killed

    first: list[dict] = []
    with pytest.raises(Killed):
        train_locally(train, tmp_path / "b", on_step=lambda row: (first.append(row), kill_at_step_2(row)))
    resumed = train_locally(train, tmp_path / "b")
    assert comparable(first[:2] + resumed) == comparable(straight)


def test_a_ddim_family_refuses_a_flow_sampler(tmp_path, mlflow_uri):
    from unirl_core.errors import UserError

    train = config(**{"train.model.family": "sd15", "train.model.path": "tiny:sd15", "train.steps": 1})
    with pytest.raises(UserError, match="sde_type: 'dummy_sampler:TruncatedSDE' does not apply to family 'sd15'"):
        train_locally(train, tmp_path)
