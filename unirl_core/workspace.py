"""The project workspace: one folder that holds the embedded defaults.

`UNIRL_HOME` (default `./.unirl`) holds the MLflow sqlite database and its artifacts, data outputs and
checkpoints. Prefect keeps its own home (`PREFECT_HOME`); we never write into it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOME = ".unirl"


@dataclass(frozen=True)
class Workspace:
    root: Path

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlflow_artifacts(self) -> Path:
        return self.root / "mlartifacts"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def serve_record(self) -> Path:
        """Written by `unirl serve` while it runs: where its Prefect and MLflow servers answer."""
        return self.root / "serve.json"

    def served(self) -> dict | None:
        """The record of a live `unirl serve` of this workspace ({"pid", "prefect_api_url", "mlflow_url"}), or None
        (none written, unreadable, or its process gone: a killed `unirl serve` leaves its record behind)."""
        import json

        try:
            record = json.loads(self.serve_record.read_text())
            os.kill(int(record["pid"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return record if isinstance(record, dict) else None

    def ensure(self) -> Workspace:
        for path in (self.root, self.mlflow_artifacts, self.data, self.outputs, self.checkpoints):
            path.mkdir(parents=True, exist_ok=True)
        return self


def workspace() -> Workspace:
    """The workspace named by `UNIRL_HOME`, or `./.unirl` in the current folder (absolute, not created)."""
    return Workspace(Path(os.environ.get("UNIRL_HOME") or DEFAULT_HOME).expanduser().resolve())
