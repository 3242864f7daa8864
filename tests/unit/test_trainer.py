"""The training controller's plan, up-front validation, retry classification, checkpoint choice and MLflow guard,
without starting Ray."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from unirl_core.config import load_recipe
from unirl_core.controller import TrainingConfigError, latest_record, plan_rounds, validate


def train_config(tmp_path, *overrides):
    return load_recipe("demo", [f"train.output_dir={tmp_path}", *overrides]).train


def test_rounds_cover_warmup_then_rl_steps_once(tmp_path):
    config = train_config(tmp_path, "train.warmup.steps=3", "train.steps=5", "train.steps_per_round=2")
    rounds = plan_rounds(config)
    assert [(r.stage, r.index, r.first, r.end) for r in rounds] == [
        ("warmup", 0, 0, 3), ("rl", 0, 3, 5), ("rl", 1, 5, 7), ("rl", 2, 7, 8),
    ]  # fmt: skip
    assert plan_rounds(train_config(tmp_path))[0].end == 24  # no steps_per_round: one round


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["train.data.prompts_per_rollout=3"], r"3 groups must divide over 2 workers \(3 % 2 = 1\)"),
        (["train.ray.workers=4", "train.data.prompts_per_rollout=4", "train.algorithm.num_updates_per_batch=3"],
         r"a divisor of the 4 samples per worker \(4 prompts x 4 samples / 4 workers\)"),
        (["train.sampling.height=40"], r"train.sampling.height: 40 must be a multiple of 16"),
        (["train.warmup.steps=2"], r"2 warm-up steps need the recipe's `precache` section"),
        (["train.warmup.steps=2", "train.warmup.batch_size=5"], r"warmup.batch_size: 5 .* \(5 % 2 = 1\)"),
    ],
)  # fmt: skip
def test_validation_refuses_up_front_with_the_arithmetic(tmp_path, overrides, expected):
    with pytest.raises(TrainingConfigError, match=expected):
        validate(train_config(tmp_path, *overrides))


def test_too_few_prompts_for_a_rollout_are_refused(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one\ntwo\n")
    config = train_config(
        tmp_path, "train.data.source=file", f"train.data.data_path={prompts}", "train.data.prompts_per_rollout=4"
    )
    with pytest.raises(TrainingConfigError, match="has 2 prompts, fewer than train.data.prompts_per_rollout=4"):
        validate(config)


def test_a_partial_checkpoint_write_falls_back_to_the_last_committed_one(tmp_path):
    from unirl_core.worker.checkpoint import CheckpointError, config_hash

    config = train_config(tmp_path)
    for step in (3, 4):
        (tmp_path / "checkpoints" / f"step_{step:08d}").mkdir(parents=True)
    (tmp_path / "checkpoints/step_00000004/__0_0.distcp").write_bytes(b"half")  # killed before its commit record
    record = {"step": 3, "global_step": 3, "config_hash": config_hash(config), "world_size": 2}
    (tmp_path / "checkpoints/step_00000003/trainer_state.json").write_text(json.dumps(record))
    folder, found = latest_record(config)
    assert folder.name == "step_00000003" and found["global_step"] == 3
    other = train_config(tmp_path, "train.ray.workers=1")
    with pytest.raises(CheckpointError, match="world_size is 2 but this run has 1"):
        latest_record(other)


def test_retry_condition_retries_lost_workers_and_deadlines_only():
    from prefect.states import Failed

    from tasks.train import is_retryable
    from unirl_core.controller import RoundDeadlineError
    from unirl_core.distributed.worker_group import WorkerLostError
    from unirl_core.worker.checkpoint import CheckpointError
    from unirl_core.worker.optim import NonFiniteError

    def retried(exc):
        return is_retryable(None, None, Failed(data=exc))

    assert retried(WorkerLostError("rank 1 died")) and retried(RoundDeadlineError("late"))
    assert retried(ConnectionResetError("gloo peer reset"))
    for permanent in (TrainingConfigError("bad"), CheckpointError("corrupt"), NonFiniteError("nan"), ValueError()):
        assert not retried(permanent)


def test_every_task_retries_io_trouble_but_never_a_full_read_only_or_forbidden_disk():
    """Each task family's retry condition: an OSError a retry may fix (EIO, a reset, a timeout) is retried; one no
    retry can fix (ENOSPC, EDQUOT, EROFS, EACCES, EPERM), raw or as our StorageError naming the path, is not."""
    import errno

    from prefect.states import Failed

    from tasks import bagel, ingest, precache, train
    from unirl_core.ingest.plan import IngestInputError
    from unirl_core.io.storage import StorageError

    for condition in (ingest.is_transient, precache.is_transient, bagel.is_transient, train.is_retryable):

        def retried(exc, condition=condition):
            return condition(None, None, Failed(data=exc))

        assert retried(OSError(errno.EIO, "I/O error")) and retried(ConnectionResetError()) and retried(TimeoutError())
        for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
            assert not retried(OSError(code, "no")) and not retried(StorageError(code, "/out/x.tar", "cannot write"))
        assert not retried(PermissionError(errno.EACCES, "denied", "/out"))
    assert not ingest.is_transient(None, None, Failed(data=IngestInputError("missing column")))


def test_training_goes_on_when_the_tracking_server_is_down(tmp_path, monkeypatch, caplog):
    from unirl_core.tracking.run_tracker import RunTracker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracker = RunTracker(tmp_path, "unirl", "down")
    with caplog.at_level(logging.WARNING, logger="unirl.tracking"):
        assert tracker.open({"a": 1}) is None
        tracker.log_metrics({"reward_mean": 1.0}, step=0)  # no exception
    assert tracker.failures >= 1
    assert "training continues" in caplog.text


def test_a_tracking_server_that_stops_answering_is_left_alone_for_a_while(tmp_path, monkeypatch, caplog):
    """RELIABILITY.md's slow MLflow server: one that accepts connections and never answers. A reopened run's first
    call times out; then no step waits on it (no new connection) until the quiet period ends, and the metrics of the
    steps in between are left out of MLflow, never logged twice."""
    import json
    import threading

    from unirl_core.tracking.run_tracker import QUIET_AFTER_OUTAGE_S, RUN_FILE, RunTracker

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(server.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    (tmp_path / RUN_FILE).write_text(json.dumps({"run_id": "a" * 32}))  # a resumed run: its id is known
    tracker = RunTracker(tmp_path, "unirl", "slow")
    with caplog.at_level(logging.WARNING, logger="unirl.tracking"):
        assert tracker.open({"a": 1}) == "a" * 32  # update_run timed out
        tried = len(held)
        for step in range(5):
            tracker.log_metrics({"reward_mean": 1.0}, step=step)
    assert tried >= 1 and len(held) == tried and tracker.skipped == 5
    assert f"no MLflow calls for the next {QUIET_AFTER_OUTAGE_S:.0f} s" in caplog.text
    tracker.finish()  # one-off calls a user looks for (the run's end, the registered model) are still tried
    assert len(held) == tried + 1
    tracker.quiet_until = 0.0  # the quiet period is over: the next step asks the server again
    tracker.log_metrics({"reward_mean": 1.0}, step=5)
    assert len(held) == tried + 2 and tracker.last_step == {}  # still unknown what MLflow holds: nothing logged
    server.close()
