"""Every family added on the contract (FLUX.1, FLUX.2-Klein, Qwen-Image, SDXL, ...) through the same loop as SD3
and SD1.x: GRPO with LoRA on its tiny model raises jpeg_compressibility over three seeds, the first update's ratio
is exactly 1, and a run stopped mid-way resumes to the uninterrupted result bitwise. The whole chain on each family
is tests/integration/test_family_chains.py; each family's own file (`test_family_<name>.py`) checks its sampler
against the stock diffusers pipeline, its log-probs, conditioning and exports.
"""

from __future__ import annotations

import pytest
from family_cases import FAMILIES, LEARNING_STEPS, family_overrides
from learning import SEEDS, STEPS, assert_learns, reward_gain
from local_training import comparable, train_locally

from unirl_core.config import load_recipe

pytestmark = pytest.mark.slow


class Killed(Exception):
    """Stands in for a kill: raised after a step was logged, before anything later is committed."""


def kill_at(step: int, rows: list[dict]):
    def on_step(row: dict) -> None:
        rows.append(row)
        if row["step"] == step:
            raise Killed

    return on_step


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_grpo_learns_on_three_seeds_and_a_stopped_run_resumes_exactly(family, tmp_path):
    overrides = family_overrides(family, tmp_path / "prompts")
    steps = LEARNING_STEPS.get(family, STEPS)
    runs = [reward_gain(overrides, seed, tmp_path / f"seed{seed}", steps) for seed in SEEDS]
    assert_learns([gain for gain, _ in runs], [metrics for _, metrics in runs])
    for _, metrics in runs:
        assert metrics[0]["ratio_mean"] == 1.0 and all(m["grad_norm"] > 0 for m in metrics)

    config = load_recipe("demo", [f"train.steps={steps}", *overrides, "train.sampling.seed=0", "train.data.seed=0",
                                  "train.checkpoint_every=4"]).train  # fmt: skip
    first: list[dict] = []
    with pytest.raises(Killed):  # steps 0-4 logged, step 3 committed: step 4 is lost with the "process"
        train_locally(config, tmp_path / "killed", on_step=kill_at(4, first))
    resumed: list[dict] = []
    with pytest.raises(Killed):  # the resumed run trains steps 4-7 (enough to compare; seed 0 ran them all)
        train_locally(config, tmp_path / "killed", on_step=kill_at(7, resumed))
    assert [row["step"] for row in resumed] == [4, 5, 6, 7]
    assert comparable(first[:4] + resumed) == comparable(runs[0][1][:8])  # seed 0's uninterrupted run, bitwise
