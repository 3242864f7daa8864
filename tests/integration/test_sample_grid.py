"""The round's sample grid is bounded: only the first `grid_prompts` prompts x `grid_images_per_prompt` samples of
its last step leave the ranks (a real step holds thousands of images; the controller never receives them all)."""

from __future__ import annotations

import pytest
from local_training import train_locally
from PIL import Image

from unirl_core.config import load_recipe
from unirl_core.worker.worker import TrainWorker

pytestmark = pytest.mark.slow


def test_only_the_grid_images_reach_the_controller(tmp_path, monkeypatch):
    returned: list[int] = []
    rollout = TrainWorker.rollout

    def counting(self, samples, step, want_outputs=(), extend=False):
        result = rollout(self, samples, step, want_outputs, extend)
        returned.append(len(result["outputs"]))
        return result

    counting.__name__, counting.__qualname__ = "rollout", "TrainWorker.rollout"  # called by method name
    monkeypatch.setattr(TrainWorker, "rollout", counting)
    sets = {"train.steps": 2, "train.data.prompts_per_rollout": 4, "train.grid_prompts": 3,
            "train.grid_images_per_prompt": 2}  # fmt: skip
    config = load_recipe("demo", [f"{k}={v}" for k, v in sets.items()]).train
    train_locally(config, tmp_path)
    assert returned == [0, 3 * 2]  # none at step 0; at the round's last step 3 prompts x 2 of 4 x 4 samples
    grid = Image.open(tmp_path / "samples" / "round_000_step_00000001.png")
    assert grid.height == 3 * (32 + 24) + 14  # 3 captioned rows of 32 px images (the step had 4 prompts), a title
