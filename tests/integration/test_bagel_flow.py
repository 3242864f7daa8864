"""The `bagel-export` flow on real Prefect: an ingested dataset -> BAGEL t2i parquet and vlm JSONL next to it, the
summary and dataset_info published as artifacts, a re-run byte-identical, bad input failed at once (no retry)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from bagel_cases import write_ingested

pytestmark = pytest.mark.slow


def _artifacts(flow_run_id) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a.data for a in found}


def test_bagel_export_flow_writes_next_to_the_dataset_and_publishes_its_info(prefect_harness, tmp_path):
    from flows.bagel import bagel_export

    source = write_ingested(tmp_path / "ds", samples=10, shard_size=4)
    state = bagel_export(source, kind="t2i", rows_per_file=4, rows_per_row_group=2, return_state=True)
    summary = state.result()
    out = Path(f"{source}-bagel/t2i")
    assert summary["out_dir"] == str(out.resolve()) and summary["samples"] == 10 and len(summary["files"]) == 3
    info = json.loads((out / "dataset_info.json").read_text())
    assert info == summary["dataset_info"] and info["num_total_samples"] == 10
    assert sum(pq.ParquetFile(p).metadata.num_rows for p in out.glob("*.parquet")) == 10
    artifacts = _artifacts(state.state_details.flow_run_id)
    assert {"bagel-export-summary", "bagel-dataset-info"} <= set(artifacts)
    assert info["data_dir"] in artifacts["bagel-dataset-info"] and "parquet_info_path" not in info
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bagel_export(source, kind="t2i", rows_per_file=4, rows_per_row_group=2)  # a re-run: the same bytes
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    vlm = bagel_export(source, kind="vlm", prompt="What is shown?")
    lines = (Path(f"{source}-bagel/vlm") / "data.jsonl").read_text().splitlines()
    assert vlm["samples"] == len(lines) == 10
    assert json.loads(lines[0])["conversations"][0]["value"] == "<image>\nWhat is shown?"


def test_bagel_export_flow_fails_bad_input_without_retrying(prefect_harness, tmp_path):
    from flows.bagel import bagel_export

    state = bagel_export(str(tmp_path / "missing.jsonl"), kind="edit", return_state=True)
    assert state.is_failed()
    with pytest.raises(ValueError, match="missing.jsonl does not exist"):
        state.result()
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        (task_run,) = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
        )
    assert task_run.run_count == 1  # bad input is not retried
