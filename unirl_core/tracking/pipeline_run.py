"""The MLflow run of one pipeline (ingest -> precache -> train): a parent whose child is the training run.

Found again by a digest of the recipe (tag `unirl.pipeline`), so a re-run of the same recipe reopens it. While it is
open, PARENT_ENV names it and the training run (RunTracker, created or reopened meanwhile) nests under it. It holds
each stage's numbers as `<stage>/<field>` metrics (rows ok and skipped, shards, samples, seconds, the final reward)
and the stage table as `pipeline_summary.md`. Guarded like the training run: MLflow down, the pipeline goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from unirl_core.tracking.run_tracker import PARENT_ENV, prefect_link, reopen

log = logging.getLogger("unirl.tracking")


class PipelineRun:
    def __init__(self, experiment: str, name: str, recipe_json: str, tags: Mapping[str, str] | None = None):
        self.experiment, self.name, self.tags = experiment, name, dict(tags or {})
        self.key = hashlib.sha256(recipe_json.encode()).hexdigest()[:32]
        self.client = None
        self.run_id: str | None = None
        self.idle_ms = 0  # a reopened run: its idle time so far (run_tracker.IDLE_TAG)

    def _guard(self, what: str, call, *args, **kwargs):
        if self.client is None or self.run_id is None:
            return None
        try:
            return call(*args, **kwargs)
        except Exception as exc:  # tracking must never stop the pipeline
            log.warning("MLflow: %s not logged (%s); the pipeline continues", what, str(exc).splitlines()[0][:200])
            return None

    def open(self) -> str | None:
        """Reopen this recipe's pipeline run, or create it; None when MLflow is down."""
        from mlflow.tracking import MlflowClient

        from unirl_core.tracking.mlflow_runs import ensure_experiment, tracking_uri
        from unirl_core.tracking.run_page import source_tags

        try:
            self.client = MlflowClient(tracking_uri())
            experiment_id = ensure_experiment(self.experiment)
            found = self.client.search_runs([experiment_id], f"tags.`unirl.pipeline` = '{self.key}'", max_results=1)
            if found:
                self.run_id = found[0].info.run_id
                self.idle_ms = reopen(self.client, self.run_id)  # a re-run: its duration leaves the gap out
            else:
                self.run_id = self.client.create_run(experiment_id, run_name=f"{self.name} pipeline").info.run_id
        except Exception as exc:
            log.warning("MLflow unavailable (%s); the pipeline continues without its run", str(exc).splitlines()[0])
            self.client = None
            return None
        tags = prefect_link(self.tags) | source_tags()
        tags |= {"unirl.pipeline": self.key, "mlflow.note.content": self.note(tags)}
        from mlflow.entities import RunTag

        self._guard("tags", lambda: self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()]))
        return self.run_id

    def note(self, tags: Mapping[str, str]) -> str:
        from unirl_core.tracking.run_page import prefect_line

        text = f"**{self.name}** pipeline: ingest -> precache -> train; the training run is its child run."
        return f"{text}\n\n{line}" if (line := prefect_line(tags)) else text

    def log_stage(self, stage: str, summary: Mapping[str, Any], seconds: float) -> None:
        """The stage's numbers (top-level numeric fields and numeric dict entries) as `<stage>/<field>` metrics."""
        from mlflow.entities import Metric

        metrics = {f"{stage}/seconds": seconds} | stage_metrics(stage, summary)
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, 0) for k, v in metrics.items()]
        self._guard(f"{stage} metrics", lambda: self.client.log_batch(self.run_id, metrics=items))

    def log_text(self, text: str, artifact_file: str) -> None:
        self._guard(artifact_file, lambda: self.client.log_text(self.run_id, text, artifact_file))

    def finish(self, status: str) -> None:
        end = int(time.time() * 1000) - self.idle_ms if self.idle_ms else None
        self._guard("run status", lambda: self.client.set_terminated(self.run_id, status, end))


def stage_metrics(stage: str, summary: Mapping[str, Any]) -> dict[str, float]:
    """{"ok": 8, "skip_reasons": {"bad": 2}, "final_metrics": {...}} -> {"ingest/ok": 8, "ingest/skip_reasons.bad": 2,
    ...}; booleans, text and lists are left out."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        if isinstance(value, Mapping):
            out |= {f"{stage}/{key}.{k}": v for k, v in value.items() if _number(v)}
        elif _number(value) and key != "seconds":
            out[f"{stage}/{key}"] = value
    return out


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@contextlib.contextmanager
def pipeline_run(
    experiment: str, name: str, recipe_json: str, tags: Mapping[str, str] | None = None
) -> Iterator[PipelineRun]:
    """Open the pipeline's run for the block (FINISHED, or FAILED if the block raised); runs created or reopened
    meanwhile by a RunTracker in this process nest under it."""
    run = PipelineRun(experiment, name, recipe_json, tags)
    previous = os.environ.get(PARENT_ENV)
    if run.open():
        os.environ[PARENT_ENV] = run.run_id
    status = "FAILED"
    try:
        yield run
        status = "FINISHED"
    finally:
        run.finish(status)
        if previous is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = previous
