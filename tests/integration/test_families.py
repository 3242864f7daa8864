"""Every family added on the contract (FLUX.1, FLUX.2-Klein, Qwen-Image, SDXL, ...) through the same loop as SD3
and SD1.x: GRPO with LoRA on its tiny model gives its golden per-step metrics (rewards, advantages, ratio, KL, loss,
gradient norm, learning rate at each of 4 steps of seed 0, rewarded with brightness; tests/support/goldens.py;
SDXL's first 2, see GOLDEN_STEPS), the first update's ratio is
exactly 1, and (for one family of each path, family_cases.RESUME_FAMILIES) a run stopped mid-way resumes to the
uninterrupted result bitwise. That GRPO raises each family's
reward over seeds 0-2 is measured by `benchmarks/algorithms.py --family <f> --only grpo` (docs/benchmarks.md); the
learning tests that run in `make test` are tests/integration/test_rl_learns.py (SD3 and SD1.x). The whole chain on
each family is tests/integration/test_family_chains.py; each family's own file (`test_family_<name>.py`) checks its
sampler against the stock diffusers pipeline, its log-probs, conditioning and exports.
"""

from __future__ import annotations

import pytest
from family_cases import FAMILIES, GOLDEN_STEPS, RESUME_FAMILIES, family_overrides
from goldens import REWARD, check_golden
from local_training import comparable, train_locally

from unirl_core.config import load_recipe

pytestmark = pytest.mark.slow

STEPS = 4


class Killed(Exception):
    """Stands in for a kill: raised after a step was logged, before anything later is committed."""


def kill_at(step: int, rows: list[dict]):
    def on_step(row: dict) -> None:
        rows.append(row)
        if row["step"] == step:
            raise Killed

    return on_step


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_grpo_gives_its_golden_steps_and_a_stopped_run_resumes_exactly(family, tmp_path):
    overrides = family_overrides(family, tmp_path / "prompts")
    config = load_recipe("demo", [f"train.steps={STEPS}", *overrides, REWARD, "train.sampling.seed=0",
                                  "train.data.seed=0", "train.checkpoint_every=2"]).train  # fmt: skip
    rows = train_locally(config, tmp_path / "run")
    assert [row["step"] for row in rows] == list(range(STEPS))
    assert rows[0]["ratio_mean"] == 1.0 and all(row["grad_norm"] > 0 for row in rows)
    check_golden("families", f"{family}/grpo/seed0", rows, steps=GOLDEN_STEPS.get(family))
    if family not in RESUME_FAMILIES:  # the checkpoints are family-independent: one family of each path resumes
        return

    first: list[dict] = []
    with pytest.raises(Killed):  # steps 0-2 logged, step 1 committed: step 2 is lost with the "process"
        train_locally(config, tmp_path / "killed", on_step=kill_at(2, first))
    resumed = train_locally(config, tmp_path / "killed")
    assert [row["step"] for row in resumed] == [2, 3]
    assert comparable(first[:2] + resumed) == comparable(rows)  # the uninterrupted run, bitwise
