"""The MLflow run of one training run (one `output_dir`), logged from the controller only.

The run id is stored in `<output_dir>/mlflow_run.json` when the run is created and in every checkpoint's trainer
state, so a retried or resumed round logs into the same run. Exactly once: a reopened run logs a metric only at
steps past the last one MLflow already holds for it (a step re-run after a kill, logged before its checkpoint
committed, is not logged twice), so every metric's step axis stays monotonic without duplicates. Every call is
guarded: when the tracking server is down, training goes on and a warning says what was not logged.

What the run page shows (run_page.py): the recipe's defining knobs as params and the whole recipe as
`recipe.yaml`, a short description, source tags (git commit, command, user, unirl version), the sample grids under
stable image keys, system metrics (CPU, memory, disk, network; GPU with nvidia-ml-py) while a round runs, and a
registered model version with a description, tags and a signature. Inside a pipeline flow the run is a child of
the pipeline's run (PARENT_ENV). How the names, values and links suit MLflow's UI: mlflow_ui.py.

Duration: MLflow shows a run's end time less its start time. A run reopened after it ended (a re-run) or after its
process died (no metric, not even a system metric, for STALE_AFTER_S) was idle meanwhile: the idle time so far is
kept in the tag `unirl.idle_seconds`, and the run ends at its true end less that time, so its duration is the
time it ran.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from unirl_core.io.storage import write_bytes_atomic
from unirl_core.tracking.mlflow_ui import axis_value, legible_grid, metric_key, page_url
from unirl_core.tracking.model_card import ModelCard
from unirl_core.tracking.run_page import recipe_yaml

log = logging.getLogger("unirl.tracking")

# A down server must not stall training for minutes (MLflow's defaults retry 7 times with backoff).
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
# ... nor a slow one stall every step: after a call fails slowly or for want of the server, MLflow is left alone for
# this long (what falls in it is not logged to MLflow; metrics.jsonl keeps every step), then tried again.
QUIET_AFTER_OUTAGE_S = 60.0
SLOW_FAILURE_S = 2.0
UNREACHABLE = ("Max retries exceeded", "timed out", "Timeout", "Connection refused", "Connection reset",
               "ConnectionError", "Failed to establish")  # fmt: skip

RUN_FILE = "mlflow_run.json"
MAX_PARAM_LENGTH = 6000
PARENT_ENV = "UNIRL_MLFLOW_PARENT_RUN_ID"  # set by pipeline_run(): runs created meanwhile nest under it
SYSTEM_METRICS_INTERVAL_S = 10.0  # one sample of CPU/memory/disk/network (and GPU) every 10 s
IDLE_TAG = "unirl.idle_seconds"  # time the run spent ended or dead before a reopening (not in its duration)
STALE_AFTER_S = 300.0  # a RUNNING run with no metric for this long was left by a dead process


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
    def __init__(self, output_dir: str | Path, experiment: str, run_name: str, tags: Mapping[str, str] | None = None,
                 sectioned: bool = True):  # fmt: skip
        """`sectioned`: training metrics, logged under their chart sections (mlflow_ui.metric_key); False: as
        named (an evaluation's `<reward>/<model>/mean`)."""
        self.output_dir, self.experiment, self.run_name = Path(output_dir), experiment, run_name
        self.key = metric_key if sectioned else str
        self.tags = dict(tags or {})
        self.run_id: str | None = None
        self.failures = 0
        self.client = None
        self.reopened = False
        self.last_step: dict[str, int] = {}  # a reopened run: the last step MLflow holds per metric
        self.quiet_until = 0.0  # time.monotonic() before which no call is made (the server was out of reach)
        self.skipped = 0  # calls left out while quiet
        self.idle_ms = 0  # a reopened run: its idle time so far (IDLE_TAG)

    # every call below goes through here; `call`: a client method name, or a function; `always`: tried even in a
    # quiet period (one-off calls a user looks for: the registered model, the run's end)
    def _guard(self, what: str, call, *args, always: bool = False, **kwargs):
        if self.client is None or self.run_id is None:
            return None
        if time.monotonic() < self.quiet_until and not always:
            self.skipped += 1
            return None
        started = time.monotonic()
        try:
            return (getattr(self.client, call) if isinstance(call, str) else call)(*args, **kwargs)
        except Exception as exc:  # tracking must never stop training
            self._failed(what, exc, time.monotonic() - started)
            return None

    def _failed(self, what: str, exc: Exception, seconds: float) -> None:
        self.failures += 1
        message = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if seconds >= SLOW_FAILURE_S or any(sign in str(exc) for sign in UNREACHABLE):
            self.quiet_until = time.monotonic() + QUIET_AFTER_OUTAGE_S
            log.warning("MLflow: %s not logged (%s, after %.0f s); no MLflow calls for the next %.0f s (metrics.jsonl "
                        "keeps every step); training continues", what, message, seconds, QUIET_AFTER_OUTAGE_S)  # fmt: skip
        else:
            log.warning("MLflow: %s not logged (%s); training continues", what, message)

    def open(
        self,
        params: Mapping[str, Any] | None = None,
        recipe: Mapping[str, Any] | None = None,
        description: str | None = None,
    ) -> str | None:
        """Find the run of this output_dir again, or create it (with the params and the resolved `recipe` as
        `recipe.yaml`); set the tags, the source tags and the description. None when MLflow is down."""
        from mlflow.tracking import MlflowClient

        from unirl_core.tracking.mlflow_runs import ensure_experiment, tracking_uri

        record = self.output_dir / RUN_FILE
        started = time.monotonic()
        try:
            uri = tracking_uri()
            if uri.startswith("sqlite:"):
                from unirl_core.workspace import workspace

                workspace().ensure()
            self.client = MlflowClient(uri)
            if record.is_file():
                self.run_id = json.loads(record.read_text())["run_id"]
                self.reopened = True  # even when the server does not answer now: its history decides what is logged
                self.idle_ms = reopen(self.client, self.run_id)
            else:
                experiment_id = ensure_experiment(self.experiment, uri)
                run = self.client.create_run(experiment_id, run_name=self.run_name)
                self.run_id = run.info.run_id
                self.output_dir.mkdir(parents=True, exist_ok=True)
                write_bytes_atomic(str(record), json.dumps({"run_id": self.run_id, "tracking_uri": uri}).encode())
                if params:
                    self.log_params(params)
                if recipe is not None:
                    self._guard("recipe.yaml", "log_text", self.run_id, recipe_yaml(recipe), "recipe.yaml")
        except Exception as exc:
            self.client = self.client if self.run_id else None
            if self.client is None:
                self.failures += 1
                log.warning("MLflow unavailable (%s); training continues without tracking", str(exc).splitlines()[0])
            else:  # a reopened run: its steps are logged when the server is back
                self._failed("the reopened run", exc, time.monotonic() - started)
            return self.run_id
        self.set_tags(self._guard("source tags", self.open_tags, description) or self.tags)
        return self.run_id

    def open_tags(self, description: str | None) -> dict[str, str]:
        """The caller's tags (a Prefect link that is no http URL dropped), the source tags, the parent run, and the
        description: set when the run is new or a Prefect flow run now holds it (a retry, a resume)."""
        from unirl_core.tracking.run_page import source_tags

        tags = source_tags() | prefect_link(self.tags)
        if os.environ.get(PARENT_ENV):
            tags["mlflow.parentRunId"] = os.environ[PARENT_ENV]
        if description and (not self.reopened or "prefect.flow_run_id" in tags):
            tags["mlflow.note.content"] = description
        return tags

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
        """One batch call per step (one round trip to a server), each metric under its chart section
        (mlflow_ui.metric_key) and as its axis prints it; in a reopened run, a metric already logged at `step` or
        later is left out."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        values = {self.key(k): axis_value(k, float(v)) for k, v in metrics.items() if isinstance(v, int | float)}
        items = [Metric(k, v, now, step) for k, v in values.items() if step > self._last_logged(k)]
        if items:
            self._guard(f"metrics of step {step}", "log_batch", self.run_id, metrics=items)
            self.last_step |= {item.key: step for item in items}

    def _last_logged(self, key: str) -> float:
        """The last step MLflow holds for `key` (-1: none); asked once per metric, only in a reopened run. Unknown
        (MLflow out of reach): infinity, so the step is left out rather than perhaps logged twice; asked again."""
        if key not in self.last_step:
            history = self._guard(f"history of {key}", "get_metric_history", self.run_id, key) if self.reopened else []
            if history is None:
                return float("inf")
            self.last_step[key] = max((m.step for m in history), default=-1)
        return self.last_step[key]

    def log_image(self, image, key: str, step: int, file: str | Path | None = None) -> None:
        """`image` under `key` at `step` (MLflow's image card: one card per key, a slider over the steps; stored as
        `images/<key>+step+...` with a compressed copy); `file`, a PNG of it, also as `<key>/<file name>`. Both at
        least mlflow_ui.MIN_GRID_WIDTH pixels wide (scaled up by a whole factor)."""
        legible = legible_grid(image)
        self._guard(f"image {key}", "log_image", self.run_id, legible, key=key, step=step)
        if file is not None and legible is image:
            self._guard(f"image file {key}", "log_artifact", self.run_id, str(file), key)
        elif file is not None:
            with tempfile.TemporaryDirectory() as folder:
                legible.save(Path(folder) / Path(file).name)
                self._guard(f"image file {key}", "log_artifact", self.run_id, str(Path(folder) / Path(file).name), key)

    def log_table(self, columns: dict[str, list], artifact_file: str) -> None:
        """A table (column -> values) as `artifact_file` (.json), which MLflow's artifact view shows as a table."""
        self._guard(f"table {artifact_file}", "log_table", self.run_id, columns, artifact_file)

    def log_file(self, file: str | Path, artifact_path: str | None = None) -> None:
        """A file as an artifact of the run (under `artifact_path`)."""
        self._guard(f"file {Path(file).name}", "log_artifact", self.run_id, str(file), artifact_path)

    def log_folder(self, folder: str | Path, artifact_path: str) -> None:
        """A folder's files as artifacts of the run under `artifact_path` (a round's sample videos and prompts)."""
        self._guard(f"folder {artifact_path}", "log_artifacts", self.run_id, str(folder), artifact_path)

    @contextlib.contextmanager
    def system_metrics(self, interval_s: float = SYSTEM_METRICS_INTERVAL_S):
        """System metrics (`system/...`: CPU, memory, disk, network, GPU with nvidia-ml-py) of this machine every
        `interval_s` (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL overrides it) for the block, continuing the run's
        system step axis on reopen; nothing when MLflow is down."""
        monitor = self._guard("system metrics", self._start_monitor, interval_s)
        try:
            yield monitor
        finally:
            if monitor is not None:
                self._guard("system metrics", monitor.finish)

    def _start_monitor(self, interval_s: float):
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        from unirl_core.tracking.mlflow_runs import tracking_uri

        monitor = SystemMetricsMonitor(self.run_id, sampling_interval=interval_s, resume_logging=True,
                                       tracking_uri=tracking_uri())  # fmt: skip
        monitor.start()
        return monitor

    def log_dataset(self, name: str, source: str, digest: str, context: str = "training") -> None:
        """A dataset as an MLflow input (shown on the run page), identified by a content digest."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(name=name, digest=digest[:36], source_type="unirl", source=json.dumps({"uri": source}))
        entry = DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])
        self._guard(f"dataset {name}", "log_inputs", self.run_id, datasets=[entry])

    def register(self, local_dir: str, artifact_path: str, model_name: str, alias: str,
                 card: ModelCard | None = None) -> str | None:  # fmt: skip
        """Log a model folder as artifacts and register it as a new version of `model_name` with `alias`; with a
        `card`, the version gets a description, tags and (an `MLmodel` file beside the folder's files) a
        signature, and the run's description the result."""

        def _register():
            self.client.log_artifacts(self.run_id, local_dir, artifact_path)
            run = self.client.get_run(self.run_id)
            if card is not None:
                self.client.log_text(self.run_id, card.mlmodel(self.run_id, artifact_path), f"{artifact_path}/MLmodel")
            source = f"{run.info.artifact_uri.rstrip('/')}/{artifact_path}"
            with contextlib.suppress(Exception):  # exists already
                self.client.create_registered_model(model_name)
            description, tags = card.version_card(run) if card else (None, {})
            version = self.client.create_model_version(model_name, source, run_id=self.run_id, tags=tags,
                                                       description=description)  # fmt: skip
            self.client.set_registered_model_alias(model_name, alias, version.version)
            if card is not None:
                note = run.data.tags.get("mlflow.note.content", "").split("\n\n**Result**")[0]
                result = f"**Result**: {card.result_line(run)}; registered `{model_name}` version {version.version}"
                self.client.set_tag(self.run_id, "mlflow.note.content", f"{note}\n\n{result} (alias `{alias}`).")
            return version.version

        return self._guard(f"model {model_name}", _register, always=True)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run; after idle time (IDLE_TAG), at its end less that time, so its duration is its running time."""
        end = int(time.time() * 1000) - self.idle_ms if self.idle_ms else None
        self._guard("run status", "set_terminated", self.run_id, status, end, always=True)

    def url(self) -> str | None:
        return run_url(self.run_id, lambda: self._guard("run lookup", "get_run", self.run_id))


def run_url(run_id: str | None, lookup=None) -> str | None:
    """The page of run `run_id` when the tracking URI is a server (http), or when it is the workspace's sqlite
    database and a live `unirl serve` serves that database's UI; else None. Asked when needed, never stored for
    later: a server's address changes between runs. `lookup()` returns the run (for its experiment id); by default
    the tracking store is asked, and a failure gives experiment 0 (MLflow's page redirects)."""
    from unirl_core.tracking.mlflow_runs import tracking_uri
    from unirl_core.workspace import workspace

    uri = tracking_uri()
    if not uri.startswith("http") and uri == f"sqlite:///{workspace().mlflow_db}":
        uri = str((workspace().served() or {}).get("mlflow_url", ""))
    if not run_id or not uri.startswith("http"):
        return None
    if lookup is None:

        def lookup():
            from mlflow.tracking import MlflowClient

            with contextlib.suppress(Exception):  # a link is not worth a failure
                return MlflowClient(tracking_uri()).get_run(run_id)
            return None

    run = lookup()
    experiment = run.info.experiment_id if run else "0"
    return page_url(uri, f"experiments/{experiment}/runs/{run_id}")


def reopen(client, run_id: str) -> int:
    """Set the run RUNNING again; its idle time so far in ms, the gap since it ended (or, left RUNNING, since its
    last metric when that is over STALE_AFTER_S old) added to IDLE_TAG."""
    run = client.get_run(run_id)
    now = int(time.time() * 1000)
    idle = int(float(run.data.tags.get(IDLE_TAG, "0")) * 1000)
    if run.info.end_time:  # it ended at end_time + idle (its shown end is its true end less the idle time)
        gap = now - run.info.end_time - idle
    else:
        last = max((m.timestamp for m in getattr(run.data, "_metric_objs", [])), default=now)
        gap = now - last if now - last > STALE_AFTER_S * 1000 else 0
    client.update_run(run_id, status="RUNNING")
    if gap > 0:
        idle += gap
        client.set_tag(run_id, IDLE_TAG, f"{idle / 1000:.1f}")
    return idle


def prefect_link(tags: Mapping[str, str]) -> dict[str, str]:
    """The caller's tags, a `*_url` that is no http URL dropped; with a Prefect flow run, the Prefect API it ran
    against (`prefect.api_url`, PREFECT_API_URL; unset: Prefect's temporary server, whose address dies with the
    command, and the flow run's id is the link)."""
    from unirl_core.tracking.run_page import http_url

    out = {k: v for k, v in tags.items() if not k.endswith("_url") or http_url(v)}
    api = http_url(os.environ.get("PREFECT_API_URL"))
    if "prefect.flow_run_id" in out and api and "prefect.api_url" not in out:
        out["prefect.api_url"] = api
    return out
