"""Training rounds on a real local Ray with 2 CPU workers (gloo, FSDP2), run by the real Prefect train flow, tracked
in a real MLflow (sqlite): a run end to end, its MLflow contents, the shards each rank holds, exports, and `unirl train`
surviving a killed worker (the round retries) and then a killed run (the rerun resumes), ending with exactly the
uninterrupted run's steps and weights."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from unirl_core.tracking.mlflow_ui import legible_grid, metric_key

RECIPE_OVERRIDES = [
    "train.warmup.steps=3",
    "train.warmup.batch_size=4",
    "train.warmup.learning_rate=0.02",
    "train.steps=4",
    "train.steps_per_round=2",
    "train.checkpoint_every=1",
    "train.eval_every_rounds=2",
    "train.eval_prompts=2",
    "train.ema.decay=0.9",
]
VOLATILE = ("seconds", "_per_s")  # timings


def load_config(output_dir: Path):
    from unirl_core.config import load_recipe

    return load_recipe("demo", [f"train.output_dir={output_dir}", *RECIPE_OVERRIDES]).train


def metric_rows(output_dir: Path) -> dict[int, dict]:
    """The last row logged for each step (a step re-run after a failure is logged again)."""
    rows = {}
    for line in (output_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = {k: v for k, v in row.items() if not any(part in k for part in VOLATILE)}
    return rows


def final_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    from unirl_core.worker.export import load_checkpoint_policy, resolve_checkpoint

    _, _, adapter = load_checkpoint_policy(resolve_checkpoint(output_dir))
    return {k: v.clone() for k, v in adapter.trainable.state_dict().items() if "lora" in k}


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        patch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
        yield f"sqlite:///{root / 'mlflow.db'}"


@pytest.fixture(scope="module")
def precache(tmp_path_factory):
    from warmup_cache import make_warmup_cache

    return make_warmup_cache(tmp_path_factory.mktemp("warmup-cache"))[0]


@pytest.fixture(scope="module")
def reference(prefect_harness, tracking, precache, tmp_path_factory):
    from flows.train import train

    output_dir = tmp_path_factory.mktemp("reference")
    summary = train(load_config(output_dir), run_name="rounds-test", precache=precache)
    return output_dir, summary


def test_warmup_then_rl_rounds_run_end_to_end_with_checkpoints_eval_and_samples(reference):
    output_dir, summary = reference
    assert [r.round for r in summary.rounds] == ["warmup round 0", "rl round 0", "rl round 1"]
    warmup = summary.rounds[0]
    assert warmup.warmup_eval_loss < warmup.warmup_eval_loss_before  # fixed draws on the same batch
    rows = metric_rows(output_dir)
    assert sorted(rows) == [0, 1, 2, 3, 4, 5, 6]  # warm-up steps 0-2, RL steps 3-6
    assert all(rows[s]["stage"] == "warmup" and rows[s]["warmup_loss"] > 0 for s in (0, 1, 2))
    assert rows[3]["ratio_min"] == rows[3]["ratio_max"] == 1.0  # pi_old recomputed at the training geometry
    assert all(rows[s]["grad_norm"] > 0 for s in (3, 4, 5, 6))
    committed = sorted(p.name for p in (output_dir / "checkpoints").iterdir())
    assert committed == ["step_00000005", "step_00000006"]  # every step committed, the last 2 kept
    record = json.loads((output_dir / "checkpoints/step_00000006/trainer_state.json").read_text())
    assert record["world_size"] == 2 and len(record["rng"]) == 2 and record["stage"] == "rl"
    assert record["mlflow_run_id"] == summary.mlflow_run_id
    assert Path(summary.rounds[1].samples).is_file()  # one grid per RL round, prompts as captions
    assert Path(summary.rounds[2].eval_samples).is_file()  # evaluation after the last round
    assert not (output_dir / "ray_processes.json").exists()  # Ray was shut down


def test_each_rank_holds_only_its_shard(reference):
    _, summary = reference
    shards = summary.rounds[0].shard_elements
    assert len(shards) == 2
    full = shards[0]["full_elements"]
    for shard in shards:
        assert shard["full_elements"] == full
        assert shard["local_elements"] <= full // 2 + 64  # about half (dim-0 chunks), never the whole model
    assert sum(s["local_elements"] for s in shards) == full


def test_mlflow_has_params_metrics_images_inputs_and_the_registered_model(reference, tracking):
    from mlflow.tracking import MlflowClient

    _, summary = reference
    client = MlflowClient(tracking)
    run = client.get_run(summary.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.eta"] == "0.7"  # the flattened resolved recipe
    assert run.data.params["model.lora.target_modules"].startswith('["to_q"')
    history = client.get_metric_history(run.info.run_id, metric_key("reward_mean"))
    assert sorted({m.step for m in history}) == [3, 4, 5, 6]
    assert len(client.get_metric_history(run.info.run_id, metric_key("warmup_loss"))) == 3
    assert run.data.tags["prefect.flow_run_id"]
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "images" in artifacts and "adapter" in artifacts
    assert sorted(d.dataset.name for d in run.inputs.dataset_inputs) == ["precache", "prompts"]
    version = client.get_model_version_by_alias(summary.registered_model, "candidate")
    assert version.run_id == run.info.run_id and str(version.version) == str(summary.model_version)


def test_the_prefect_flow_run_logs_its_steps_shows_progress_and_a_plain_summary(reference, tracking):
    """What a user watching the Prefect UI sees: per-step lines in the flow run's logs, a progress artifact at 100%
    once done, the summary without raw sentinels; the MLflow run's link to the flow run is a real http URL."""
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, LogFilter, LogFilterFlowRunId

    _, summary = reference
    tags = MlflowClient(tracking).get_run(summary.mlflow_run_id).data.tags
    flow_run_id = tags["prefect.flow_run_id"]
    assert tags.get("prefect.flow_run_url", "http").startswith("http")  # never "None/flow-runs/..."
    with get_client(sync_client=True) as client:
        deadline = time.monotonic() + 60  # logs reach the API in batches
        while True:
            lines = [
                log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
            ]
            if any(line.startswith("step 6 (rl round 1): reward") for line in lines) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        artifacts = {a.key: a for a in client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))}  # fmt: skip
    steps = [line.split()[1] for line in lines if line.startswith("step ")]
    assert steps == ["0", "1", "2", "3", "4", "5", "6"], lines  # every step of these short rounds, in order
    assert any(line.startswith("step 0 (warm-up round 0): loss ") for line in lines)
    assert artifacts["train-progress"].data == 100.0
    table = artifacts["train-summary"].data
    assert "started fresh" in table and "| -1 |" not in table


def test_mlflow_image_cards_open_on_a_grid_and_slide_over_one_per_round(reference, tracking, tmp_path):
    """MLflow's image card starts at step 0: each key's grids are numbered 0, 1, ... (one per round), and also
    stored under plain names."""
    from mlflow.tracking import MlflowClient
    from PIL import Image

    output_dir, summary = reference
    client, run_id = MlflowClient(tracking), summary.mlflow_run_id
    images = [a.path for a in client.list_artifacts(run_id, "images") if a.path.endswith(".png")]
    for key, grids in (("samples", [0, 1]), ("eval", [0])):  # a grid per RL round; one evaluation, after round 2
        steps = sorted(int(p.split("+step+")[1].split("+")[0]) for p in images if p.startswith(f"images/{key}+"))
        assert steps == grids
    first = next(p for p in images if p.startswith("images/samples+step+0+"))
    local = legible_grid(Image.open(summary.rounds[1].samples))  # scaled up by a whole factor to >= 512 px wide
    card = Image.open(client.download_artifacts(run_id, first, str(tmp_path)))
    assert card.width >= 512 and card.tobytes() == local.tobytes()
    grids = [f"samples/{Path(r.samples).name}" for r in summary.rounds[1:]]
    tables = [f"samples/{Path(r.samples).name.split('_step_')[0]}.json" for r in summary.rounds[1:]]  # each round's
    assert [a.path for a in client.list_artifacts(run_id, "samples")] == sorted(grids + tables)  # samples as a table


def test_mlflow_run_page_has_a_short_description_few_params_sources_and_system_metrics(reference, tracking):
    from mlflow.tracking import MlflowClient

    output_dir, summary = reference
    client = MlflowClient(tracking)
    run = client.get_run(summary.mlflow_run_id)
    note = run.data.tags["mlflow.note.content"]
    last = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert "**rounds-test**" in note and f"final reward_mean {last['reward_mean']:.4g}" in note
    assert "tracker_buffer_size" not in note and len(note) < 1000  # no parameter dump
    assert 0 < len(run.data.params) <= 15 and run.data.params["steps"] == "4"
    assert run.data.tags["unirl.version"] and run.data.tags["mlflow.user"]
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert "recipe.yaml" in [a.path for a in client.list_artifacts(run.info.run_id)]  # the whole resolved recipe
    version = client.get_model_version(summary.registered_model, summary.model_version)
    assert f"final reward_mean {last['reward_mean']:.4g}" in version.description
    assert version.tags["family"] == "sd3" and version.tags["steps"] == "4" and version.tags["algorithm"] == "grpo"
    mlmodel = Path(client.download_artifacts(summary.mlflow_run_id, "adapter/MLmodel")).read_text()
    assert "signature:" in mlmodel and "[-1, 32, 32, 3]" in mlmodel


def test_exports_load_with_from_pretrained_and_match_the_trained_model(reference, tmp_path):
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from peft import PeftModel

    from unirl_core.worker.export import export_checkpoint, load_checkpoint_policy, resolve_checkpoint

    output_dir, summary = reference
    _, _, trained = load_checkpoint_policy(resolve_checkpoint(output_dir))
    adapter_dir = Path(summary.export)
    base = SD3Transformer2DModel.from_pretrained(json.loads((adapter_dir / "adapter_config.json").read_text())[
        "base_model_name_or_path"])  # fmt: skip
    peft_model = PeftModel.from_pretrained(base, str(adapter_dir))
    merged = StableDiffusion3Pipeline.from_pretrained(str(export_checkpoint(output_dir, tmp_path / "m", merged=True)))
    stock = StableDiffusion3Pipeline.from_pretrained(
        str(Path(peft_model.peft_config["default"].base_model_name_or_path).parent)
    )
    stock.load_lora_weights(str(adapter_dir))  # diffusers' own LoRA loader, alpha/rank from the metadata
    torch.manual_seed(0)
    x = torch.randn(1, 4, 16, 16)
    inputs = {"hidden_states": x, "timestep": torch.tensor([500.0]), "encoder_hidden_states": torch.randn(1, 8, 64),
              "pooled_projections": torch.randn(1, 64), "return_dict": False}  # fmt: skip
    with torch.no_grad():
        expected = trained.trainable(**inputs)[0]
        assert torch.allclose(peft_model(**inputs)[0], expected, atol=1e-5)
        assert torch.allclose(merged.transformer(**inputs)[0], expected, atol=1e-4)
        assert torch.allclose(stock.transformer(**inputs)[0], expected, atol=1e-5)
        with trained.reference():
            untrained = trained.trainable(**inputs)[0]
    assert not torch.allclose(untrained, expected, atol=1e-4)  # the export carries the training


def _kill_a_worker_of(process: subprocess.Popen, marker: Path, killed: list[int]) -> None:
    """SIGKILL one training worker of `process`'s own local Ray once `marker` is committed."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if marker.is_file():
            for child in psutil.Process(process.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if any("TrainWorker" in part for part in child.cmdline()):
                        child.kill()
                        killed.append(child.pid)
                        return
        time.sleep(0.05)


def test_unirl_train_survives_a_killed_worker_then_a_killed_run_and_ends_as_the_uninterrupted_one(
    reference, precache, tmp_path
):
    """`unirl train RECIPE` (warm-up + RL rounds on 2 workers): one training worker SIGKILLed after RL round 0's first
    commit (step 3), so the round retries and resumes from that checkpoint; then the whole run (driver and the local
    Ray it started) SIGKILLed mid-round 1 and run again: the steps after the last committed checkpoint equal the
    uninterrupted run's bitwise, and so do the final weights."""
    import yaml
    from prefect.settings import PREFECT_API_URL

    from unirl_core.config import load_recipe
    from unirl_core.controller import RAY_RECORD
    from unirl_core.distributed.cluster import stop_recorded

    reference_dir, _ = reference
    output_dir = tmp_path / "sigkilled"
    recipe = load_recipe("demo", [f"train.output_dir={output_dir}", *RECIPE_OVERRIDES])
    recipe = recipe.model_copy(update={"name": "killed", "precache": precache})
    recipe_path = tmp_path / "killed.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe.model_dump(mode="json", exclude_none=True)))
    command = [str(Path(sys.executable).parent / "unirl"), "train", str(recipe_path)]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()
    killed: list[int] = []
    _kill_a_worker_of(process, output_dir / "checkpoints/step_00000003/trainer_state.json", killed)
    assert killed, "no worker was killed: " + "".join(output)[-3000:]
    marker = output_dir / "checkpoints/step_00000005/trainer_state.json"  # RL round 1, its first step
    deadline = time.monotonic() + 300
    while not marker.is_file() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "".join(output)[-3000:]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    reader.join(timeout=10)
    stop_recorded(output_dir / RAY_RECORD)  # what the flow's on_crashed hook does under a worker
    assert not (output_dir / "checkpoints/step_00000006").exists()
    steps = [line.split()[0] for line in output if line.split() and line.split()[0].isdigit()]
    assert steps == ["3", "4", "5"], "".join(output)[-3000:]  # the retry resumed after step 3: step 3 ran once

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "warmup round 0: steps 0-2, already committed" in rerun.stdout
    assert "rl round 0: steps 3-4, already committed" in rerun.stdout
    assert "registered model: unirl-killed version 1 (alias candidate)" in rerun.stdout
    assert metric_rows(output_dir) == metric_rows(reference_dir)  # every reward, loss, ratio, grad norm and lr
    expected, got = final_weights(reference_dir), final_weights(output_dir)
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
