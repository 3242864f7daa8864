"""The pipeline flow on the synthetic demo data: ingest -> precache -> warm-up -> RL rounds with real Prefect, Ray (2
CPU workers), MLflow (sqlite) and tiny models; a re-run redoes nothing and returns the same model version."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_synthetic_rows_are_deterministic_and_include_counted_bad_rows():
    from unirl_core.data.synthetic import synthetic_prompts, synthetic_rows

    rows = synthetic_rows(8, seed=3)
    assert rows == synthetic_rows(8, seed=3) and rows != synthetic_rows(8, seed=4)
    assert len(rows) == 11 and sum(r["image"] is None or r["caption"] == "a corrupt image" for r in rows) == 3
    prompts = synthetic_prompts(8, seed=3)
    assert all(p in {r["caption"] for r in rows} for p in prompts)
    assert any("stripes" in p for p in prompts) and any("gradient" in p for p in prompts)


def test_pipeline_runs_every_stage_and_a_rerun_redoes_nothing(prefect_harness, tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    from flows.pipeline import pipeline, report
    from unirl_core.config import load_recipe
    from unirl_core.data.synthetic import synthetic_prompts, write_synthetic_parquet
    from unirl_core.summaries import PipelineSummary, TrainSummary

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("INPUT_PARQUET", write_synthetic_parquet(str(tmp_path / "synthetic.parquet"), rows=16))
    (tmp_path / "prompts.txt").write_text("\n".join(synthetic_prompts(16)))
    monkeypatch.setenv("DATA_PATH", str(tmp_path / "prompts.txt"))
    overrides = [f"ingest.dataset_output_root={tmp_path / 'data'}", f"train.output_dir={tmp_path / 'out'}",
                 "train.warmup.steps=2", "train.warmup.batch_size=4", "train.steps=2", "train.steps_per_round=2",
                 "train.eval_every_rounds=0"]  # fmt: skip
    recipe = load_recipe("pipeline_demo", overrides)
    first = pipeline(recipe)
    assert isinstance(first, PipelineSummary) and isinstance(first.train, TrainSummary)
    ingest, precache, train = first.ingest, first.precache, first.train
    assert (ingest.ok, ingest.skipped) == (16, 3)
    assert sorted(ingest.skip_reasons) == ["blocked_address", "decode_error", "no_image"]
    assert precache.samples == 16
    assert [r.round for r in train.rounds] == ["warmup round 0", "rl round 0"]
    assert train.alias == "candidate" and set(first.seconds) == {"ingest", "precache", "train", "promote"}
    assert first.promote.promoted and first.promote.reason.startswith("the first version")  # the gate's stage
    # train.eval on the Ray workers: the point before the first RL step (after the warm-up) and after the last
    assert [p.step for p in train.eval.points] == [2, 4] and train.eval.best_step in (2, 4)
    assert set(train.eval.points[0].metrics) == {"aesthetic/jpeg_compressibility", "aesthetic/edge_density"}
    assert train.eval.points[0].metrics["aesthetic/jpeg_compressibility"]["n"] == 4
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect_client:
        artifacts = {a.key: a for a in prefect_client.read_latest_artifacts()}
    assert "Evaluation during training" in artifacts["train-summary"].data  # the eval curve on the flow run's page
    assert f"best step: {train.eval.best_step}" in artifacts["train-summary"].data
    assert PipelineSummary.model_validate_json(first.model_dump_json()) == first  # JSON round trip, no pickle
    # in MLflow: a parent run per pipeline holding each stage's numbers, the training run its child
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    parent_id = client.get_run(train.mlflow_run_id).data.tags["mlflow.parentRunId"]
    parent = client.get_run(parent_id)
    assert parent.info.status == "FINISHED" and parent.data.metrics["ingest/ok"] == 16
    assert parent.data.metrics["precache/samples"] == 16

    again = pipeline(recipe)
    assert all(r.skipped for r in again.train.rounds)  # every round already committed
    assert again.train.model_version == train.model_version  # no second registration
    assert again.promote.reason == f"version {train.model_version} is the champion already"
    assert again.precache.samples == 16 and (first.precache.encoded, again.precache.encoded) == (16, 0)
    table = report(again).splitlines()  # what `unirl run` prints: every stage says it reused its outputs
    assert (
        "16 of 19 rows ok (reused)" in table[2] and "16 samples reused" in table[3] and "2 rounds (reused)" in table[4]
    )
    assert "16 samples encoded" in report(first).splitlines()[3]
    assert client.get_run(again.train.mlflow_run_id).data.tags["mlflow.parentRunId"] == parent_id  # found again

    # `unirl run`, as a user runs it: the stage table from the typed summaries, then each round's mean
    command = [str(Path(sys.executable).parent / "unirl"), "run", "pipeline_demo"]
    command += [arg for override in overrides for arg in ("--set", override)]
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(rf"\btrain\s+2 rounds \(reused\), model version {train.model_version}\s", result.stdout), (
        result.stdout
    )
    assert f"last checkpoint: {train.checkpoint}\n" in result.stdout  # whole paths, never cropped to a width
    assert "warmup round 0: mean warm-up loss" in result.stdout and "over 2 steps" in result.stdout
    assert "rl round 0: mean reward" in result.stdout
