"""MLflow runs: the only module family that imports mlflow.

The embedded default is a sqlite database and local artifacts in the workspace (`$UNIRL_HOME/mlflow.db`,
`$UNIRL_HOME/mlartifacts`); `MLFLOW_TRACKING_URI` points elsewhere (a tracking server). Library code returns
metric dicts; only this module turns them into MLflow calls.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from unirl_core.tracking.mlflow_ui import EXPERIMENT_KIND_TAG, MODEL_KINDS, MODEL_TRAINING_KIND
from unirl_core.workspace import workspace


def tracking_uri() -> str:
    """`MLFLOW_TRACKING_URI` if set, else the workspace's sqlite database."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{workspace().mlflow_db}"


def ensure_experiment(name: str, uri: str | None = None) -> str:
    """The id of experiment `name`, created with artifacts in the workspace when the store is local; created or
    reused, it is a model-training experiment (`mlflow.experimentKind`, mlflow_ui.py), so MLflow's UI does not
    take it for a GenAI one."""
    client = MlflowClient(uri or tracking_uri())
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.tags.get(EXPERIMENT_KIND_TAG) not in MODEL_KINDS:  # made before the tag, or by someone else
            client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
        return found.experiment_id
    artifact_location = None
    if (uri or tracking_uri()).startswith("sqlite:"):
        ws = workspace().ensure()
        artifact_location = (ws.mlflow_artifacts / name).as_uri()
    return client.create_experiment(name, artifact_location=artifact_location,
                                    tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})  # fmt: skip


@contextmanager
def mlflow_run(
    experiment: str, run_name: str, params: Mapping[str, Any] | None = None, run_id: str | None = None
) -> Iterator[str]:
    """Start (or, with `run_id`, resume) a run; yields its id and ends it, FAILED if the body raised."""
    uri = tracking_uri()
    if uri.startswith("sqlite:"):
        workspace().ensure()
    mlflow.set_tracking_uri(uri)
    experiment_id = ensure_experiment(experiment, uri)
    run = mlflow.start_run(run_id=run_id, experiment_id=None if run_id else experiment_id, run_name=run_name)
    status = "FAILED"
    try:
        if params:
            mlflow.log_params({k: str(v) for k, v in params.items()})
        yield run.info.run_id
        status = "FINISHED"
    finally:
        mlflow.end_run(status=status)


def log_metrics(metrics: Mapping[str, float], step: int) -> None:
    """Log a dict of scalar metrics at `step` in one batch call (one round trip to a server)."""
    mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)
