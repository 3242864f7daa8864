"""Every video family (Wan 2.1 text- and image-to-video, Wan 2.2 A14B's two experts, TI2V-5B, HunyuanVideo 1.5) on
`demo_video`'s settings: GRPO's per-step metrics at seed 0 equal its golden ones (tests/support/goldens.py), the
first update's ratio is exactly 1, and a run stopped at step 2 resumes to the uninterrupted one bitwise. Learning:
tests/integration/test_video_learns.py.
"""

from __future__ import annotations

import pytest
from goldens import check_golden
from learning import seeded
from local_training import comparable, train_locally

pytestmark = pytest.mark.slow


class Killed(Exception):
    """Stands in for a kill: raised after a step was logged, before anything later is committed."""


HUNYUAN_LORA = "train.model.lora.target_modules=[to_q,to_k,to_v,to_out.0,ff.net.0.proj,ff.net.2,proj_out]"


@pytest.mark.parametrize("family", ["wan", "wan_i2v", "wan2_2", "wan_ti2v", "hunyuan_video15"])
def test_a_stopped_video_run_resumes_exactly_and_gives_its_golden_steps(family, tmp_path):
    """Every Wan family's per-step GRPO metrics (seed 0, 4 steps) equal its golden ones, and a run stopped at step
    2 resumes to the uninterrupted one bitwise; image-to-video trains on prompts with a condition image each."""
    from flows.cli import demo_prompts

    overrides = [f"train.model.family={family}", f"train.model.path=tiny:{family}", "train.checkpoint_every=2"]
    overrides += [HUNYUAN_LORA] if family == "hunyuan_video15" else []
    if family == "wan_i2v":
        overrides += ["train.data.source=file", f"train.data.data_path={demo_prompts(family, tmp_path, 8)}"]
    config = seeded("demo_video", 0, 4, overrides)
    rows = train_locally(config, tmp_path / "run")
    assert rows[0]["ratio_mean"] == 1.0 and all(row["grad_norm"] > 0 for row in rows)
    first: list[dict] = []

    def kill_at_2(row: dict) -> None:
        first.append(row)
        if row["step"] == 2:
            raise Killed

    with pytest.raises(Killed):  # steps 0-2 logged, step 1 committed: step 2 is lost with the "process"
        train_locally(config, tmp_path / "killed", on_step=kill_at_2)
    resumed = train_locally(config, tmp_path / "killed")
    assert [row["step"] for row in resumed] == [2, 3]
    assert comparable(first[:2] + resumed) == comparable(rows)  # the uninterrupted run, bitwise
    check_golden("families", f"{family}/grpo/seed0", rows)
