"""Checkpoints commit atomically and a resumed run continues exactly (the rounds' controller on one rank in this
process: the `--local` transport)."""

from __future__ import annotations

import pytest
import torch
from local_training import comparable, on_one_rank, train_locally

from unirl_core.config import load_recipe
from unirl_core.models.registry import build_family
from unirl_core.train.checkpoint import CheckpointError, CheckpointManager, ModelState, OptimizerState, RankCheckpoint

pytestmark = pytest.mark.slow


class Killed(Exception):
    """Stands in for a kill: raised after a step was logged, before anything later is committed."""


def config(**overrides):
    return load_recipe("demo", [f"{k}={v}" for k, v in overrides.items()]).train


def trained_weights(train_config, folder):
    adapter = build_family(train_config.model, train_config.sampling)
    RankCheckpoint({"model": ModelState(adapter.trainable)}).load(folder, weights_only=True)
    return {n: p.detach().clone() for n, p in adapter.trainable.named_parameters() if p.requires_grad}


def kill_after(step: int):
    def on_step(row: dict) -> None:
        if row["step"] == step:
            raise Killed(step)

    return on_step


def test_a_run_stopped_mid_way_resumes_with_exactly_the_uninterrupted_steps(tmp_path):
    train = config(**{"train.algorithm.std_mode": "per_prompt", "train.algorithm.tracker_min_count": 4,
                      "train.steps": 5, "train.checkpoint_every": 2})  # fmt: skip
    straight = train_locally(train, tmp_path / "a")
    first: list[dict] = []
    with pytest.raises(Killed):  # steps 0-2 logged; step 1 committed, step 2 is lost with the process
        train_locally(train, tmp_path / "b", on_step=lambda row: (first.append(row), kill_after(2)(row)))
    resumed = train_locally(train, tmp_path / "b")
    assert [m["step"] for m in resumed] == [2, 3, 4]
    assert comparable(first[:2] + resumed) == comparable(straight)  # bitwise: rewards, losses, ratios, lr
    a, b = (CheckpointManager(tmp_path / name / "checkpoints").latest() for name in ("a", "b"))
    assert a.name == b.name == "step_00000004"
    weights_a, weights_b = trained_weights(train, a), trained_weights(train, b)
    assert weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def test_partial_writes_are_ignored_retention_keeps_two_and_errors_name_the_file(tmp_path):
    train = config(**{"train.steps": 5, "train.checkpoint_every": 1})
    root = tmp_path / "checkpoints"
    with pytest.raises(Killed):  # steps 0-3 committed, step 4 logged and lost
        train_locally(train, tmp_path, on_step=kill_after(4))
    manager = CheckpointManager(root)
    assert [p.name for p in manager.committed()] == ["step_00000002", "step_00000003"]  # keep=2, oldest deleted
    (root / "step_00000009").mkdir()  # a write killed before its commit record
    (root / "step_00000009" / "__0_0.distcp").write_bytes(b"half")
    assert manager.latest().name == "step_00000003"
    resumed = train_locally(train, tmp_path)
    assert [m["step"] for m in resumed] == [4]
    assert not (root / "step_00000009").exists()  # cleaned by the next save
    latest = manager.latest()
    data = next(latest.glob("*.distcp"))
    data.write_bytes(b"\x00" * data.stat().st_size)
    adapter = build_family(train.model, train.sampling)
    with pytest.raises(CheckpointError, match=r"step_00000004.*distcp"):
        optimizer = OptimizerState(adapter.trainable, torch.optim.AdamW(adapter.parameters()))
        RankCheckpoint({"model": ModelState(adapter.trainable), "optim": optimizer}).load(latest)
    changed = config(**{"train.algorithm.learning_rate": "0.05", "train.steps": 5})
    with pytest.raises(CheckpointError, match="config_hash"):
        train_locally(changed, tmp_path)


def test_named_states_come_back_with_one_load(tmp_path):
    """The controller's states (data cursor, advantage tracker, progress) are restored by `load()` alone."""
    from unirl_core.algorithms.advantages import PerPromptStatTracker
    from unirl_core.data.sources import build_source
    from unirl_core.trainer.controller import checkpoints

    train = on_one_rank(config(**{"train.steps": 2}), tmp_path)
    train_locally(train, tmp_path)
    source, tracker = build_source(train.data), PerPromptStatTracker(4, 2)
    folder, record = checkpoints(train, {"source": source, "tracker": tracker}).load()
    assert folder.name == "step_00000001" and record["global_step"] == 1 and record["world_size"] == 1
    expected = build_source(train.data)
    expected.next_batch(), expected.next_batch()  # two steps drew two batches
    assert source.state_dict() == expected.state_dict() == record["source"]


def test_unirl_train_local_checkpoints_and_resumes(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    args = ["train", "demo", "--local", "--checkpoint-every", "1", "--set", f"train.output_dir={tmp_path}"]
    first = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert first.exit_code == 0, first.output
    assert (tmp_path / "checkpoints" / "step_00000001" / "trainer_state.json").is_file()
    again = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert again.exit_code == 0 and "rl round 0: steps 0-1, already committed" in again.stdout, again.output
