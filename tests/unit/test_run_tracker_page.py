"""The training run's MLflow pages as a user finds them, against a real sqlite store: source tags and a working
Prefect link, a few params with the whole recipe beside them, sample grids under their key at each step, system
metrics, the registered version's description, tags and signature, and the pipeline's parent run."""

from __future__ import annotations

import json
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
ML = "?workflowType=machine_learning"  # the UI's machine-learning side (mlflow_ui.page_url)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """One sqlite store for the module (creating its tables takes seconds); each test its own experiment."""
    from mlflow.tracking import MlflowClient

    root = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        patch.setenv("UNIRL_HOME", str(root / "home"))
        yield MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def open_run(output_dir, tags=None, **kwargs):
    from unirl_core.tracking.run_tracker import RunTracker

    tracker = RunTracker(output_dir, output_dir.parent.name, "demo", tags)
    tracker.open(**kwargs)
    return tracker


def test_the_run_records_its_commit_user_version_and_a_working_prefect_link(tmp_path, client):
    tags = {"prefect.flow_run_id": "6f1c", "prefect.flow_run_url": "http://127.0.0.1:4200/runs/flow-run/6f1c"}
    tracker = open_run(tmp_path / "a", tags, description="**demo**: tiny")
    run = client.get_run(tracker.run_id).data.tags
    assert run["unirl.version"] == version("unirl") and run["mlflow.user"] and run["mlflow.source.name"]
    if (REPO / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        assert run["mlflow.source.git.commit"] == head.stdout.strip()
    assert run["prefect.flow_run_url"] == tags["prefect.flow_run_url"]
    assert run["mlflow.note.content"] == "**demo**: tiny"
    unknown = {"prefect.flow_run_id": "6f1c", "prefect.flow_run_url": "None/flow-runs/flow-run/6f1c"}
    other = client.get_run(open_run(tmp_path / "b", unknown).run_id).data.tags
    assert "prefect.flow_run_url" not in other and other["prefect.flow_run_id"] == "6f1c"


def test_the_run_has_the_defining_params_and_the_whole_recipe_as_an_artifact(tmp_path, client):
    from unirl_core.config import load_recipe
    from unirl_core.tracking.run_page import key_params
    from unirl_core.tracking.run_tracker import flatten

    recipe = load_recipe("demo").train.model_dump(mode="json")
    tracker = open_run(tmp_path / "out", params=key_params(flatten(recipe)), recipe=recipe)
    params = client.get_run(tracker.run_id).data.params
    assert params["algorithm.eta"] == "0.7" and "algorithm.tracker_buffer_size" not in params
    text = Path(client.download_artifacts(tracker.run_id, "recipe.yaml", str(tmp_path))).read_text()
    assert yaml.safe_load(text) == recipe


def test_sample_grids_are_found_under_their_key_at_each_step_and_by_a_plain_name(tmp_path, client):
    tracker = open_run(tmp_path / "out")
    for step, color in ((0, "red"), (1, "blue")):
        path = tmp_path / f"out/samples/round_{step:03d}_step_{step * 8 + 7:08d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (40, 30), color).save(path)
        tracker.log_image(Image.open(path), key="samples", step=step, file=path)
    images = [a.path for a in client.list_artifacts(tracker.run_id, "images")]
    for step, color in ((0, (255, 0, 0)), (1, (0, 0, 255))):  # the image card reads `<key>+step+<step>+...`
        (name,) = [p for p in images if p.startswith(f"images/samples+step+{step}+") and p.endswith(".png")]
        assert Image.open(client.download_artifacts(tracker.run_id, name, str(tmp_path))).getpixel((5, 5)) == color
    plain = [a.path for a in client.list_artifacts(tracker.run_id, "samples")]
    assert plain == ["samples/round_000_step_00000007.png", "samples/round_001_step_00000015.png"]
    assert tracker.failures == 0


def test_system_metrics_are_logged_while_a_round_runs_and_continue_on_reopen(tmp_path, client, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    tracker = open_run(tmp_path / "out")
    with tracker.system_metrics():
        time.sleep(1.0)
    first = client.get_metric_history(tracker.run_id, "system/cpu_utilization_percentage")
    assert len(first) >= 2 and "system/system_memory_usage_megabytes" in client.get_run(tracker.run_id).data.metrics
    reopened = open_run(tmp_path / "out")  # the next round
    with reopened.system_metrics():
        time.sleep(0.6)
    steps = [m.step for m in client.get_metric_history(tracker.run_id, "system/cpu_utilization_percentage")]
    assert len(steps) > len(first) and len(set(steps)) == len(steps)  # one step axis, no step logged twice


def test_the_registered_version_has_a_description_tags_and_a_signature(tmp_path, client):
    from unirl_core.tracking.model_card import ModelCard

    tracker = open_run(tmp_path / "out", description="**demo**: tiny")
    tracker.log_dataset("prompts", "smoke", "ab" * 20)
    for step, reward in enumerate((0.1, 0.25, 0.375)):
        tracker.log_metrics({"reward_mean": reward}, step)
    model = tmp_path / "adapter"
    model.mkdir()
    (model / "adapter_config.json").write_text(json.dumps({"r": 8}))
    card = ModelCard(run_name="demo", family="sd3", base_model="tiny:sd3", algorithm="grpo", steps=3,
                     warmup_steps=0, height=32, width=48, format="peft-lora-adapter")  # fmt: skip
    number = tracker.register(str(model), "adapter", "unirl-demo", "candidate", card)
    found = client.get_model_version_by_alias("unirl-demo", "candidate")
    assert found.version == number
    assert "demo" in found.description and "final reward_mean 0.375" in found.description
    assert "prompts `abababababab`" in found.description
    assert found.tags["family"] == "sd3" and found.tags["algorithm"] == "grpo" and found.tags["steps"] == "3"
    run_tags = client.get_run(tracker.run_id).data.tags
    assert found.tags["unirl.version"] == version("unirl")
    assert found.tags.get("git_commit") == run_tags.get("mlflow.source.git.commit")
    # the model version page reads `MLmodel` from the version's source for its schema
    mlmodel = yaml.safe_load(
        Path(client.download_artifacts(tracker.run_id, "adapter/MLmodel", str(tmp_path))).read_text()
    )
    assert json.loads(mlmodel["signature"]["inputs"])[0]["name"] == "prompt"
    assert json.loads(mlmodel["signature"]["outputs"])[0]["tensor-spec"]["shape"] == [-1, 32, 48, 3]
    assert found.source.endswith("/adapter") and mlmodel["flavors"] == {}
    assert (
        "final reward_mean 0.375" in run_tags["mlflow.note.content"] and "**demo**" in run_tags["mlflow.note.content"]
    )


def test_a_training_run_inside_a_pipeline_is_its_child_and_a_rerun_finds_both_again(tmp_path, client):
    from unirl_core.tracking.pipeline_run import pipeline_run

    for _ in range(2):
        with pipeline_run(tmp_path.name, "demo", '{"recipe": 1}', {"prefect.flow_run_url": "None/x"}) as parent:
            child = open_run(tmp_path / "out")
            parent.log_stage("ingest", {"ok": 8, "skipped": 2}, seconds=1.5)
    runs = client.search_runs([client.get_experiment_by_name(tmp_path.name).experiment_id])
    assert len(runs) == 2  # the same parent and child both times
    pipeline = client.get_run(parent.run_id)
    assert client.get_run(child.run_id).data.tags["mlflow.parentRunId"] == parent.run_id
    assert pipeline.info.status == "FINISHED" and pipeline.data.metrics["ingest/ok"] == 8
    assert "prefect.flow_run_url" not in pipeline.data.tags
    outside = open_run(tmp_path / "alone")  # no pipeline: no parent
    assert "mlflow.parentRunId" not in client.get_run(outside.run_id).data.tags


def test_the_image_card_opens_on_the_first_grid_of_each_key():
    from types import SimpleNamespace

    from unirl_core.config import load_recipe
    from unirl_core.controller.grids import Grids
    from unirl_core.controller.round_plan import plan_rounds

    config = load_recipe("demo", ["train.steps=8", "train.steps_per_round=2", "train.eval_every_rounds=3"]).train
    rl = [r for r in plan_rounds(config) if r.stage == "rl"]  # 4 rounds; evaluated: rounds 2 and 3 (the last)
    numbers = {key: [Grids.grid_number(SimpleNamespace(config=config, round=r), key) for r in rl]
               for key in ("samples", "eval")}  # fmt: skip
    assert numbers["samples"] == [0, 1, 2, 3]
    assert [numbers["eval"][i] for i in (2, 3)] == [0, 1]  # MLflow's card opens at step 0: the first eval grid


def test_the_run_link_points_at_the_mlflow_ui_of_a_running_unirl_serve(tmp_path, client, monkeypatch):
    """With the workspace's own sqlite store, the run has a page only while `unirl serve` serves it: its record
    gives the link (a record left by a dead process gives none)."""
    from unirl_core.tracking.run_tracker import run_url
    from unirl_core.workspace import workspace

    store = Path(client.tracking_uri.removeprefix("sqlite:///"))
    monkeypatch.setenv("UNIRL_HOME", str(store.parent))  # the module's store is this workspace's database
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert workspace().mlflow_db == store
    tracker = open_run(tmp_path / "out")
    assert tracker.url() is None
    record = {"pid": __import__("os").getpid(), "mlflow_url": "http://127.0.0.1:5055", "prefect_api_url": ""}
    workspace().serve_record.write_text(json.dumps(record))
    experiment = client.get_run(tracker.run_id).info.experiment_id
    assert tracker.url() == f"http://127.0.0.1:5055/#/experiments/{experiment}/runs/{tracker.run_id}{ML}"
    assert run_url(tracker.run_id) == tracker.url()  # a finished training's re-run asks again (another port, ...)
    workspace().serve_record.write_text(json.dumps(record | {"mlflow_url": "http://127.0.0.1:5066"}))
    assert run_url(tracker.run_id) == f"http://127.0.0.1:5066/#/experiments/{experiment}/runs/{tracker.run_id}{ML}"
    dead = subprocess.Popen(["true"])
    dead.wait()
    workspace().serve_record.write_text(json.dumps(record | {"pid": dead.pid}))
    assert tracker.url() is None
