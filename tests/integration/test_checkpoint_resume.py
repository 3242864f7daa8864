"""Checkpoints commit atomically and a resumed run continues exactly (the rounds' controller on one rank in this
process: the `--local` transport)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from local_training import comparable, on_one_rank, train_locally

from unirl_core.config import load_recipe
from unirl_core.models.registry import build_family
from unirl_core.tracking.mlflow_ui import metric_key
from unirl_core.worker.checkpoint import CheckpointError, CheckpointManager, ModelState, OptimizerState, RankCheckpoint

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


def logged_steps(output_dir) -> tuple[list[int], dict[str, list[int]]]:
    """The steps of `metrics.jsonl`'s rows, and per MLflow metric the steps of its history, in logging order."""
    from mlflow.tracking import MlflowClient

    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])  # not mlflow's process-wide URI an earlier test set
    run_id = json.loads((output_dir / "mlflow_run.json").read_text())["run_id"]
    keys = client.get_run(run_id).data.metrics
    history = {key: [m.step for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]
               for key in keys}  # fmt: skip
    return [row["step"] for row in rows], history


def test_a_run_stopped_mid_way_resumes_with_exactly_the_uninterrupted_steps(tmp_path, mlflow_uri):
    train = config(**{"train.algorithm.std_mode": "per_prompt", "train.algorithm.tracker_min_count": 4,
                      "train.steps": 5, "train.checkpoint_every": 2})  # fmt: skip
    straight = train_locally(train, tmp_path / "a")
    first: list[dict] = []
    with pytest.raises(Killed):  # steps 0-2 logged; step 1 committed, step 2 is lost with the process
        train_locally(train, tmp_path / "b", on_step=lambda row: (first.append(row), kill_after(2)(row)))
    assert logged_steps(tmp_path / "b")[0] == [0, 1, 2]
    resumed = train_locally(train, tmp_path / "b")
    assert [m["step"] for m in resumed] == [2, 3, 4]
    assert comparable(first[:2] + resumed) == comparable(straight)  # bitwise: rewards, losses, ratios, lr
    rows, history = logged_steps(tmp_path / "b")  # exactly once: step 2 ran twice, is logged once
    assert rows == [0, 1, 2, 3, 4]
    assert history[metric_key("reward_mean")] == [0, 1, 2, 3, 4] and all(
        steps == sorted(set(steps)) for steps in history.values()
    )
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
    from unirl_core.controller.controller import checkpoints
    from unirl_core.data.sources import build_source

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


def flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_naming_the_file_or_replaced_by_the_previous_one(tmp_path, mlflow_uri):
    """One flipped byte in the latest checkpoint: `fail` (default) names the file; `previous` moves it aside and
    trains its steps again from the checkpoint before, to the same bytes; each step is logged once."""
    from typer.testing import CliRunner

    from flows.cli import app

    train = config(**{"train.steps": 4, "train.checkpoint_every": 1})
    train_locally(train, tmp_path)
    root = tmp_path / "checkpoints"
    damaged = root / "step_00000003" / "__0_0.distcp"
    committed = json.loads((damaged.parent / "trainer_state.json").read_text())["files"]
    assert set(committed) == {".metadata", "__0_0.distcp", "train_config.json"}
    flip_a_byte(damaged)
    with pytest.raises(CheckpointError, match=r"step_00000003/__0_0\.distcp: CRC-32 is \w{8}, \w{8} was committed"):
        train_locally(train, tmp_path)  # the round is complete, but a resume would read the damaged file
    args = [
        "train",
        "demo",
        "--local",
        "--steps",
        "4",
        "--checkpoint-every",
        "1",
        "--set",
        f"train.output_dir={tmp_path}",
    ]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2 and "__0_0.distcp: CRC-32" in refused.stderr and "Traceback" not in refused.output
    resumed = train_locally(config(**{"train.steps": 4, "train.checkpoint_every": 1,
                                      "train.checkpoint.on_corrupt": "previous"}), tmp_path)  # fmt: skip
    assert [m["step"] for m in resumed] == [3]  # from step 2's checkpoint
    aside = root / "step_00000003.corrupt"
    assert aside.is_dir() and [p.name for p in CheckpointManager(root).committed()] == [
        "step_00000002",
        "step_00000003",
    ]
    again = json.loads((root / "step_00000003" / "trainer_state.json").read_text())["files"]
    assert again["__0_0.distcp"] == committed["__0_0.distcp"]  # trained again: the bytes it had when committed
    rows, history = logged_steps(tmp_path)
    assert rows == [0, 1, 2, 3] and history[metric_key("reward_mean")] == [0, 1, 2, 3]
    truncated = root / "step_00000003" / ".metadata"
    truncated.write_bytes(truncated.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"step_00000003/\.metadata: has \d+ bytes, \d+ were committed"):
        train_locally(train, tmp_path)


def test_a_non_finite_loss_stops_the_run_before_its_optimizer_step_naming_the_step_and_samples(tmp_path, mlflow_uri):
    """RELIABILITY.md's NaN case through the whole stack: a learning rate of 1e30 makes step 0's update overflow the
    weights, so step 1's loss is NaN. The run stops there, before step 1's optimizer step, naming the step and its
    samples; nothing of step 1 is logged or committed; `unirl train` says it in one line, exit 2."""
    from typer.testing import CliRunner

    from flows.cli import app
    from unirl_core.worker.optim import NonFiniteError

    train = config(**{"train.steps": 4, "train.checkpoint_every": 1, "train.algorithm.learning_rate": 1e30})
    rows: list[dict] = []
    samples = r"\['prompt:\d+:sample:\d+'(, 'prompt:\d+:sample:\d+')*\]"
    with pytest.raises(
        NonFiniteError, match=rf"^step 1: non-finite loss for samples {samples}; optimizer step skipped"
    ):
        train_locally(train, tmp_path / "direct", on_step=rows.append)
    assert [row["step"] for row in rows] == [0]
    assert [p.name for p in CheckpointManager(tmp_path / "direct" / "checkpoints").committed()] == ["step_00000000"]
    assert logged_steps(tmp_path / "direct")[0] == [0]

    args = ["train", "demo", "--local", "--steps", "4", "--set", "train.algorithm.learning_rate=1e30",
            "--set", f"train.output_dir={tmp_path / 'cli'}"]  # fmt: skip
    stopped = CliRunner().invoke(app, args)
    assert stopped.exit_code == 2 and "Traceback" not in stopped.output, stopped.output
    assert [line for line in stopped.stderr.splitlines() if "step 1: non-finite loss" in line], stopped.stderr


def test_a_checkpoint_written_before_algorithm_configs_resumes(tmp_path, mlflow_uri):
    """Each algorithm got its own config class, so the resolved config's dump (and its hash) lost the other
    algorithms' keys; a checkpoint an earlier unirl wrote carries the old hash (`legacy_config_hash`, with those keys
    at their defaults) and still resumes. Any other hash is still refused."""
    from unirl_core.worker.checkpoint import STATE_FILE, config_hash, legacy_config_hash

    # the hash b463b9a computed for the packaged demo recipe (its checkpoints carry it)
    assert legacy_config_hash(config()) == "cb09e202ec01ac4d" != config_hash(config())
    train = config(**{"train.steps": 3, "train.checkpoint_every": 1})
    with pytest.raises(Killed):
        train_locally(train, tmp_path, on_step=kill_after(1))  # step 0 committed
    record_path = CheckpointManager(tmp_path / "checkpoints").latest() / STATE_FILE
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps(record | {"config_hash": legacy_config_hash(train)}))
    assert [row["step"] for row in train_locally(train, tmp_path)] == [1, 2]
    record_path = CheckpointManager(tmp_path / "checkpoints").latest() / STATE_FILE
    assert json.loads(record_path.read_text())["config_hash"] == config_hash(train)  # new checkpoints: the new hash
    record_path.write_text(json.dumps(json.loads(record_path.read_text()) | {"config_hash": "0123456789abcdef"}))
    with pytest.raises(CheckpointError, match="config_hash is '0123456789abcdef'"):
        train_locally(train, tmp_path)
