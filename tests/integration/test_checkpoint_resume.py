"""Checkpoints commit atomically and a resumed run continues exactly (the single-process runner)."""

from __future__ import annotations

import pytest
import torch

from unirl_core.config import load_recipe
from unirl_core.models.registry import build_family
from unirl_core.train.checkpoint import CheckpointError, CheckpointManager
from unirl_core.train.local import iter_local

pytestmark = pytest.mark.slow

TIMING = ("seconds_rollout", "seconds_reward", "seconds_train", "images_per_s", "checkpoint")


def config(**overrides):
    return load_recipe("demo", [f"{k}={v}" for k, v in overrides.items()]).train


def comparable(metrics):
    return [{k: v for k, v in m.items() if k not in TIMING} for m in metrics]


def trained_weights(train_config, folder):
    adapter = build_family(train_config.model, train_config.sampling)
    optimizer = torch.optim.AdamW(adapter.parameters())
    CheckpointManager(folder.parent).load(folder, adapter.trainable, optimizer)
    return {n: p.detach().clone() for n, p in adapter.trainable.named_parameters() if p.requires_grad}


def test_a_run_stopped_mid_way_resumes_with_exactly_the_uninterrupted_steps(tmp_path):
    train = config(**{"train.algorithm.std_mode": "per_prompt", "train.algorithm.tracker_min_count": 4})
    straight = list(iter_local(train, 5, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=2))
    interrupted = iter_local(train, 5, checkpoint_dir=str(tmp_path / "b"), checkpoint_every=2)
    first = [next(interrupted) for _ in range(3)]  # steps 0-2; step 1 committed, step 2 is lost with the process
    interrupted.close()
    resumed = list(iter_local(train, 5, checkpoint_dir=str(tmp_path / "b"), checkpoint_every=2))
    assert [m["step"] for m in resumed] == [2, 3, 4]
    assert comparable(first[:2] + resumed) == comparable(straight)  # bitwise: rewards, losses, ratios, lr
    a, b = (CheckpointManager(tmp_path / name).latest() for name in ("a", "b"))
    assert a.name == b.name == "step_00000004"
    weights_a, weights_b = trained_weights(train, a), trained_weights(train, b)
    assert weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def test_partial_writes_are_ignored_retention_keeps_two_and_errors_name_the_file(tmp_path):
    train = config()
    root = tmp_path / "ckpt"
    list(iter_local(train, 4, checkpoint_dir=str(root), checkpoint_every=1))
    manager = CheckpointManager(root)
    assert [p.name for p in manager.committed()] == ["step_00000002", "step_00000003"]  # keep=2, oldest deleted
    (root / "step_00000009").mkdir()  # a write killed before its commit record
    (root / "step_00000009" / "__0_0.distcp").write_bytes(b"half")
    assert manager.latest().name == "step_00000003"
    resumed = list(iter_local(train, 5, checkpoint_dir=str(root), checkpoint_every=1))
    assert [m["step"] for m in resumed] == [4]
    assert not (root / "step_00000009").exists()  # cleaned by the next save
    latest = manager.latest()
    data = next(latest.glob("*.distcp"))
    data.write_bytes(b"\x00" * data.stat().st_size)
    adapter = build_family(train.model, train.sampling)
    with pytest.raises(CheckpointError, match=r"step_00000004.*distcp"):
        manager.load(latest, adapter.trainable, torch.optim.AdamW(adapter.parameters()))
    changed = config(**{"train.algorithm.learning_rate": "0.05"})
    with pytest.raises(CheckpointError, match="config_hash"):
        list(iter_local(changed, 6, checkpoint_dir=str(root)))


def test_unirl_train_local_checkpoints_and_resumes(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    args = ["train", "demo", "--local", "--checkpoint-every", "2", "--set", f"train.output_dir={tmp_path}"]
    first = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert first.exit_code == 0, first.output
    assert (tmp_path / "checkpoints" / "step_00000001" / "trainer_state.json").is_file()
    again = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert again.exit_code == 0 and "nothing to do" in again.stdout
