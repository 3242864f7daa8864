"""The MLflow run of one training run (one `output_dir`), logged from the controller only.

The run id is stored in `<output_dir>/mlflow_run.json` when the run is created and in every checkpoint's trainer
state, so a retried or resumed round logs into the same run. Exactly once: a reopened run logs a metric only at
steps past the last one MLflow already holds for it (a step re-run after a kill, logged before its checkpoint
committed, is not logged twice), so every metric's step axis stays monotonic without duplicates. Every call is
guarded: when the tracking server is down, training goes on and a warning says what was not logged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unirl_core.io.storage import write_bytes_atomic

log = logging.getLogger("unirl.tracking")

# A down server must not stall training for minutes (MLflow's defaults retry 7 times with backoff).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")

RUN_FILE = "mlflow_run.json"
MAX_PARAM_LENGTH = 6000


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: the resolved recipe as MLflow params."""
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for key, item in value.items():
            out |= flatten(item, f"{prefix}{key}.")
        return out
    text = json.dumps(value) if isinstance(value, list | tuple) else str(value)
    return {prefix.rstrip("."): text[:MAX_PARAM_LENGTH]}


class RunTracker:
    def __init__(self, output_dir: str | Path, experiment: str, run_name: str, tags: Mapping[str, str] | None = None):
        self.output_dir, self.experiment, self.run_name = Path(output_dir), experiment, run_name
        self.tags = dict(tags or {})
        self.run_id: str | None = None
        self.failures = 0
        self.client = None
        self.reopened = False
        self.last_step: dict[str, int] = {}  # a reopened run: the last step MLflow holds per metric

    # every call below goes through here; `call`: a client method name, or a function
    def _guard(self, what: str, call, *args, **kwargs):
        if self.client is None or self.run_id is None:
            return None
        try:
            return (getattr(self.client, call) if isinstance(call, str) else call)(*args, **kwargs)
        except Exception as exc:  # tracking must never stop training
            self.failures += 1
            log.warning("MLflow: %s not logged (%s); training continues", what, str(exc).splitlines()[0][:200])
            return None

    def open(self, params: Mapping[str, Any] | None = None) -> str | None:
        """Find the run of this output_dir again, or create it (with the params); None when MLflow is down."""
        from mlflow.tracking import MlflowClient

        from unirl_core.tracking.mlflow_runs import ensure_experiment, tracking_uri

        record = self.output_dir / RUN_FILE
        try:
            uri = tracking_uri()
            if uri.startswith("sqlite:"):
                from unirl_core.workspace import workspace

                workspace().ensure()
            self.client = MlflowClient(uri)
            if record.is_file():
                self.run_id = json.loads(record.read_text())["run_id"]
                self.client.update_run(self.run_id, status="RUNNING")
                self.reopened = True
            else:
                experiment_id = ensure_experiment(self.experiment, uri)
                run = self.client.create_run(experiment_id, run_name=self.run_name)
                self.run_id = run.info.run_id
                self.output_dir.mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(str(record), json.dumps({"run_id": self.run_id, "tracking_uri": uri}).encode())
                if params:
                    self.log_params(params)
        except Exception as exc:
            self.failures += 1
            log.warning("MLflow unavailable (%s); training continues without tracking", str(exc).splitlines()[0])
            self.client = self.client if self.run_id else None
            return self.run_id
        self.set_tags(self.tags)
        return self.run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)) for k, v in flatten(dict(params)).items()]
        for start in range(0, len(items), 100):  # MLflow's batch limit
            self._guard("params", "log_batch", self.run_id, params=items[start : start + 100])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        if tags:
            self._guard("tags", "log_batch", self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """One batch call per step (one round trip to a server); in a reopened run, a metric already logged at
        `step` or later is left out."""
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
        items = [Metric(k, v, now, step) for k, v in values.items() if step > self._last_logged(k)]
        if items:
            self._guard(f"metrics of step {step}", "log_batch", self.run_id, metrics=items)
            self.last_step |= {item.key: step for item in items}

    def _last_logged(self, key: str) -> int:
        """The last step MLflow holds for `key` (-1: none); asked once per metric, only in a reopened run."""
        if key not in self.last_step:
            history = self._guard(f"history of {key}", "get_metric_history", self.run_id, key) if self.reopened else []
            self.last_step[key] = max((m.step for m in history or []), default=-1)
        return self.last_step[key]

    def log_image(self, image, key: str, step: int) -> None:
        self._guard(f"image {key}", "log_image", self.run_id, image, key=key, step=step)

    def log_dataset(self, name: str, source: str, digest: str, context: str = "training") -> None:
        """A dataset as an MLflow input (shown on the run page), identified by a content digest."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(name=name, digest=digest[:36], source_type="unirl", source=json.dumps({"uri": source}))
        entry = DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])
        self._guard(f"dataset {name}", "log_inputs", self.run_id, datasets=[entry])

    def register(self, local_dir: str, artifact_path: str, model_name: str, alias: str) -> str | None:
        """Log a model folder as artifacts and register it as a new version of `model_name` with `alias`."""

        def _register():
            self.client.log_artifacts(self.run_id, local_dir, artifact_path)
            run = self.client.get_run(self.run_id)
            source = f"{run.info.artifact_uri.rstrip('/')}/{artifact_path}"
            with contextlib.suppress(Exception):  # exists already
                self.client.create_registered_model(model_name)
            version = self.client.create_model_version(model_name, source, run_id=self.run_id)
            self.client.set_registered_model_alias(model_name, alias, version.version)
            return version.version

        return self._guard(f"model {model_name}", _register)

    def finish(self, status: str = "FINISHED") -> None:
        self._guard("run status", "set_terminated", self.run_id, status)

    def url(self) -> str | None:
        """The run page when the tracking URI is a server (http); else None."""
        from unirl_core.tracking.mlflow_runs import tracking_uri

        uri = tracking_uri()
        if not self.run_id or not uri.startswith("http"):
            return None
        run = self._guard("run lookup", "get_run", self.run_id)
        experiment = run.info.experiment_id if run else "0"
        return f"{uri.rstrip('/')}/#/experiments/{experiment}/runs/{self.run_id}"
