"""One loop, two transports, and runs that do not depend on the worker count.

`unirl train --local` is the rounds' controller driving one rank in this process; a 1-worker Ray round is the same
controller driving one Ray actor: their steps are equal bitwise. Every random draw of a rollout depends on (seed,
step, sample id) only, so 1 and 2 workers give bitwise-equal rewards at every step; their losses and gradient norms
agree within float summation order (gloo averages the two ranks' gradients)."""

from __future__ import annotations

import json

import pytest
from local_training import comparable, on_one_rank, train_locally

from unirl_core.config import load_recipe

pytestmark = pytest.mark.slow

STEPS = 3


def demo(**overrides):
    settings = {"train.steps": STEPS, "train.eval_every_rounds": 0, **overrides}
    return load_recipe("demo", [f"{k}={v}" for k, v in settings.items()]).train


def ray_rows(config) -> list[dict]:
    from unirl_core.controller import METRICS_FILE, output_dir, plan_rounds, run_round

    for round_ in plan_rounds(config):
        run_round(config, round_)
    return [json.loads(line) for line in (output_dir(config) / METRICS_FILE).read_text().splitlines()]


@pytest.fixture(scope="module")
def one_worker(ray_local, tmp_path_factory) -> list[dict]:
    """The 1-worker Ray round both tests compare with (run once)."""
    return ray_rows(on_one_rank(demo(), tmp_path_factory.mktemp("one-worker"), cpus_per_worker=1))


def test_local_and_a_one_worker_ray_round_give_the_same_steps_bitwise(one_worker, tmp_path):
    local = train_locally(demo(), tmp_path / "local", cpus_per_worker=1)
    assert [row["step"] for row in local] == list(range(STEPS))
    assert comparable(local) == comparable(one_worker)  # every reward, loss, ratio, grad norm and lr


def test_one_and_two_workers_give_the_same_rewards(one_worker, tmp_path):
    config, one = demo(), one_worker
    two_config = config.model_copy(update={"output_dir": str(tmp_path / "two"),
                                           "ray": config.ray.model_copy(update={"workers": 2})})  # fmt: skip
    two = ray_rows(two_config)
    assert [r["reward_mean"] for r in one] == [r["reward_mean"] for r in two]  # bitwise, every step
    assert [r["reward_std"] for r in one] == [r["reward_std"] for r in two]
    for key in ("loss", "grad_norm", "ratio_mean"):
        largest = max(abs(a[key] - b[key]) for a, b in zip(one, two, strict=True))
        scale = max(abs(a[key]) for a in one) or 1.0
        print(f"1 vs 2 workers, {STEPS} steps: largest {key} difference {largest:.3g} (largest value {scale:.3g})")
        assert largest <= 1e-5 * scale + 1e-8, (key, largest)  # summation order only
