"""`train.eval` on the tiny SD3 demo (one rank, `unirl train --local`): points before the first RL step, every N
steps and after the last, logged to MLflow on the step axis with their per-prompt tables; training trains exactly as
without them; a resume after losing a checkpoint recomputes only the lost point, to the same numbers; a guard with
`stop` stops the run at its breach (exit 2, one line, the checkpoint committed) and again on a rerun, and with `stop:
false` the run goes on and reports the breach."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.tracking.mlflow_ui import metric_key

pytestmark = pytest.mark.slow

EVAL = ["--set", "train.eval.every=2", "--set", "train.eval.sets=[{prompts: aesthetic, count: 6}]"]


@pytest.fixture
def env(mlflow_uri, tmp_path):
    return tmp_path


def _train(out, *args):
    return CliRunner().invoke(app, ["train", "demo", "--local", "--set", f"train.output_dir={out}", *args])


def _rows(out) -> list[dict]:
    """Each step's metrics but its timings."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("seconds") and not k.endswith("_per_s")} for row in rows]


def test_eval_points_are_logged_on_the_step_axis_and_leave_training_unchanged(env, mlflow_uri):
    from mlflow.tracking import MlflowClient

    run = env / "run"
    rounds = ["--set", "train.checkpoint_every=2", "--set", "train.steps_per_round=2"]  # point 2 ends round 0
    result = _train(run, "--steps", "4", *rounds, *EVAL)
    assert result.exit_code == 0, result.output
    assert [line.split(":")[0].strip() for line in result.output.splitlines() if "eval at step" in line] == [
        "eval at step 0", "eval at step 2", "eval at step 4"
    ]  # fmt: skip
    assert "eval: 3 points, best step" in result.output
    for step in (0, 2, 4):
        table = pq.read_table(run / "eval" / f"step_{step:08d}" / "aesthetic.parquet").to_pylist()
        assert len(table) == 6 and {"prompt", "jpeg_compressibility", "edge_density"} <= set(table[0])

    client = MlflowClient(mlflow_uri)
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("unirl").experiment_id])
    history = client.get_metric_history(mlflow_run.info.run_id, metric_key("eval/aesthetic/jpeg_compressibility"))
    assert [m.step for m in history] == [0, 2, 4]
    points = {s: json.loads((run / "eval" / f"step_{s:08d}" / "point.json").read_text()) for s in (0, 2, 4)}
    assert [m.value for m in history] == [points[s]["metrics"]["aesthetic/jpeg_compressibility"]["mean"] for s in
                                          (0, 2, 4)]  # fmt: skip
    best = max((0, 2, 4), key=lambda s: (points[s]["metrics"]["aesthetic/jpeg_compressibility"]["mean"], -s))
    assert mlflow_run.data.tags["unirl.eval.best_step"] == str(best)
    assert [a.path for a in client.list_artifacts(mlflow_run.info.run_id, "eval/step_00000002")] == [
        "eval/step_00000002/aesthetic.parquet"
    ]

    # the same recipe without train.eval trains to the same numbers (evaluation leaves the RNG as it was)
    plain = env / "plain"
    assert _train(plain, "--steps", "4", *rounds, "--set", "train.eval=null").exit_code == 0
    assert _rows(plain) == _rows(run)

    # a kill lost the last checkpoint (step 3) after its point (4) was written: the resume drops and recomputes
    # point 4 only, to the same numbers, and MLflow keeps one value per step
    import shutil

    kept = (run / "eval" / "step_00000002" / "point.json").stat().st_mtime_ns
    shutil.rmtree(run / "checkpoints" / "step_00000003")
    again = _train(run, "--steps", "4", *rounds, *EVAL)
    assert again.exit_code == 0, again.output
    assert [line.split(":")[0].strip() for line in again.output.splitlines() if "eval at step" in line] == [
        "eval at step 4"
    ]
    assert (run / "eval" / "step_00000002" / "point.json").stat().st_mtime_ns == kept
    recomputed = json.loads((run / "eval" / "step_00000004" / "point.json").read_text())
    assert recomputed["metrics"] == points[4]["metrics"]
    history = client.get_metric_history(mlflow_run.info.run_id, metric_key("eval/aesthetic/jpeg_compressibility"))
    assert [m.step for m in history] == [0, 2, 4]


def test_a_guard_with_stop_stops_the_run_at_its_breach_and_without_stop_it_is_reported(env, mlflow_uri):
    from mlflow.tracking import MlflowClient

    run = env / "negated"
    # trained on the negated reward: the training reward rises while the held-out jpeg_compressibility falls
    args = ["--steps", "6", *EVAL, "--set", "train.reward.weights={jpeg_compressibility: -1.0}"]
    stop = ["--set", "train.eval.guards=[{metric: aesthetic/jpeg_compressibility, stop: true}]"]
    result = _train(run, *args, *stop)
    assert result.exit_code == 2, result.output
    (error,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "train.eval.guards: eval/aesthetic/jpeg_compressibility fell from" in error
    assert "the run stopped before step 2 (checkpoint step 1 committed)" in error
    assert [p.name for p in (run / "checkpoints").glob("step_*")] == ["step_00000001"]
    client = MlflowClient(mlflow_uri)
    (mlflow_run,) = client.search_runs([client.get_experiment_by_name("unirl").experiment_id])
    assert mlflow_run.data.tags["unirl.eval.guard_breach"].startswith("step 2: eval/aesthetic/jpeg_compressibility")

    rows = _rows(run)
    again = _train(run, *args, *stop)  # stopped there again, before any step runs
    assert again.exit_code == 2 and "train.eval.guards:" in again.output
    assert _rows(run) == rows

    goes_on = ["--set", "train.eval.guards=[{metric: aesthetic/jpeg_compressibility, stop: false}]"]
    finished = _train(run, *args, *goes_on)
    assert finished.exit_code == 0, finished.output
    assert "1 guard breach" in finished.output  # the breach at step 2, reported in the summary line
    assert [r["step"] for r in _rows(run)] == list(range(6))

    # breached at the last point (after the last step): stopped, nothing exported; a rerun stays stopped
    last = env / "last"
    for _ in range(2):
        stopped = _train(last, "--steps", "2", *args[2:], *stop)
        assert stopped.exit_code == 2 and "the run stopped before step 2" in stopped.output, stopped.output
    assert not (last / "export").exists() and [p.name for p in (last / "checkpoints").glob("step_*")] == [
        "step_00000001"
    ]
