"""What MLflow's UI shows of our runs (unirl_core/tracking/mlflow_ui.py), against a real sqlite store: a
model-training experiment, the reward chart first, axes that print the values, a true duration after a resume,
the Prefect flow run named on every run, sample grids wide enough to read, links on the machine-learning side."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PIL import Image

# The training metrics of one RL step (a diffusion run with train eval), as the trainer returns them.
STEP = {"reward_mean": -1.4, "reward_std": 0.1, "reward_jpeg_compressibility_mean": -1.4, "zero_std_ratio": 0.0,
        "advantage_mean": 1.4e-17, "advantage_abs_max": 1.7, "ratio_mean": 1.0, "clip_fraction": 0.0,
        "approx_kl": 3e-5, "loss": -2.0e-8, "lr": 1e-7, "grad_norm": 0.03, "seconds_train": 1.2,
        "images_per_s": 8.0, "eval/aesthetic/jpeg_compressibility": -1.3}  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        patch.setenv("UNIRL_HOME", str(root / "home"))
        patch.delenv("PREFECT_API_URL", raising=False)
        yield MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def tracker(output_dir: Path, tags=None, **kwargs):
    from unirl_core.tracking.run_tracker import RunTracker

    found = RunTracker(output_dir, output_dir.parent.name, "demo", tags)
    found.open(**kwargs)
    return found


def charts_in_order(keys) -> list[str]:
    """MLflow 3.17's run charts (RunsChartsCardConfig.getBaseChartAndSectionConfigs): sections named by the key's
    part before its last `/`, sorted, the unprefixed section ("Model metrics") last; keys sorted in a section."""
    sections = sorted({k.rpartition("/")[0] for k in keys} - {""}) + [""]
    return [k for section in sections for k in sorted(keys) if k.rpartition("/")[0] == section]


def test_experiments_are_model_training_ones_also_when_reused(tmp_path, client):
    from unirl_core.tracking.mlflow_runs import ensure_experiment

    created = client.get_experiment(ensure_experiment(tmp_path.name))
    assert created.tags["mlflow.experimentKind"] == "custom_model_development"
    old = client.create_experiment(f"{tmp_path.name}-old")  # made before the tag existed
    assert "mlflow.experimentKind" not in client.get_experiment(old).tags
    assert ensure_experiment(f"{tmp_path.name}-old") == old
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"


def test_the_charts_tab_leads_with_the_reward_and_its_axes_print_the_values(tmp_path, client):
    run = tracker(tmp_path / "out")
    run.log_metrics(STEP, step=0)
    logged = client.get_run(run.run_id).data.metrics
    order = charts_in_order(list(logged))
    assert order[:3] == ["reward/reward_mean", "reward/reward_std", "reward/eval/aesthetic/jpeg_compressibility"]
    assert logged["reward/reward_mean"] == -1.4 and len(logged) == len(STEP)  # every metric, once
    assert logged["train/advantage_mean"] == 0.0 and logged["train/loss"] == 0.0  # noise: 0, as the axis prints
    assert logged["train/lr"] == 1e-7 and logged["train/approx_kl"] == 3e-5  # real small values are kept


def test_a_resumed_run_lasts_the_time_it_ran_not_the_gap_before_the_resume(tmp_path, client):
    first = tracker(tmp_path / "out")
    time.sleep(0.3)
    first.finish()
    time.sleep(2.0)  # ended; then a re-run reopens it
    again = tracker(tmp_path / "out")
    time.sleep(0.3)
    again.finish()
    info = client.get_run(first.run_id).info
    assert again.run_id == first.run_id and info.status == "FINISHED"
    assert 0.5 <= (info.end_time - info.start_time) / 1000 < 1.6  # two sessions of ~0.3 s, not the 2 s between
    third = tracker(tmp_path / "out")  # a second resume keeps the first gap out as well
    third.finish()
    info = client.get_run(first.run_id).info
    assert (info.end_time - info.start_time) / 1000 < 1.6
    assert float(client.get_run(first.run_id).data.tags["unirl.idle_seconds"]) >= 2.0


def test_a_run_names_its_prefect_flow_run_also_on_a_temporary_server(tmp_path, client, monkeypatch):
    from unirl_core.tracking.run_page import run_description

    temporary = {"prefect.flow_run_id": "6f1c", "prefect.flow_run_name": "brave-fox"}
    note = run_description({}, "demo", temporary)
    run = client.get_run(tracker(tmp_path / "a", temporary, description=note).run_id).data.tags
    assert "brave-fox (id `6f1c`)" in run["mlflow.note.content"] and "temporary server" in run["mlflow.note.content"]
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4311/api")
    served = client.get_run(tracker(tmp_path / "b", temporary, description=run_description({}, "demo", temporary))
                            .run_id).data.tags  # fmt: skip
    assert served["prefect.api_url"] == "http://127.0.0.1:4311/api" and served["prefect.flow_run_id"] == "6f1c"
    assert "`http://127.0.0.1:4311/api`" in served["mlflow.note.content"]


def test_a_small_sample_grid_is_stored_wide_enough_to_read(tmp_path, client):
    run = tracker(tmp_path / "out")
    path = tmp_path / "out/samples/round_000_step_00000007.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (100, 70), "red").save(path)
    run.log_image(Image.open(path), key="samples", step=0, file=path)
    card = next(a.path for a in client.list_artifacts(run.run_id, "images") if a.path.endswith(".png"))
    for name in (card, "samples/round_000_step_00000007.png"):
        image = Image.open(client.download_artifacts(run.run_id, name, str(tmp_path / name.replace("/", "_"))))
        assert image.width >= 512 and image.size == (600, 420)  # a whole factor: no blur


def test_run_links_open_the_uis_machine_learning_side(tmp_path, client, monkeypatch):
    from unirl_core.tracking.run_tracker import run_url

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5311")
    lookup = lambda: type("Run", (), {"info": type("Info", (), {"experiment_id": "3"})})  # noqa: E731
    assert run_url("abc", lookup) == "http://127.0.0.1:5311/#/experiments/3/runs/abc?workflowType=machine_learning"


def test_a_run_left_running_by_a_dead_process_counts_the_time_since_its_last_metric_as_idle(
    tmp_path, client, monkeypatch
):
    """A process killed mid-run leaves its run RUNNING; reopened after STALE_AFTER_S without a metric, the time
    since its last metric is idle (not in its duration); reopened sooner, nothing is."""
    from unirl_core.tracking import run_tracker

    killed = tracker(tmp_path / "out")
    killed.log_metrics({"reward_mean": -1.0}, step=0)  # then the process dies: no finish()
    monkeypatch.setattr(run_tracker, "STALE_AFTER_S", 1.0)
    assert tracker(tmp_path / "out").idle_ms == 0  # reopened at once: a live restart, no idle time
    time.sleep(1.5)
    again = tracker(tmp_path / "out")
    assert again.run_id == killed.run_id and again.idle_ms >= 1000
    again.finish()
    info = client.get_run(killed.run_id).info
    assert float(client.get_run(killed.run_id).data.tags["unirl.idle_seconds"]) >= 1.0
    assert (info.end_time - info.start_time) / 1000 < 1.5  # the 1.5 s since the metric left out
