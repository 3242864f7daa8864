"""Registered model versions as local folders: `models:/NAME@ALIAS` or `models:/NAME/VERSION` -> the version's
files (what `unirl export` wrote and the training run registered), downloaded once into the workspace
(`$UNIRL_HOME/models/registered/<server>/<name>/<version>`, <server> a digest of the tracking URI, written aside and renamed whole)."""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from pathlib import Path

from unirl_core.errors import UserError

MODEL_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[\w.-]+)|/(?P<version>\d+))")


class ModelVersionError(UserError, LookupError):
    """A registered model version that cannot be found; the message names it and what exists."""


def parse(uri: str) -> tuple[str, str | None, str | None] | None:
    """(name, alias, version) of a `models:/` URI, or None for anything else."""
    match = MODEL_URI.fullmatch(uri)
    return (match["name"], match["alias"], match["version"]) if match else None


def resolve_version(uri: str) -> tuple[str, str]:
    """(name, version number) that `uri` names now (an alias moves; a version number does not)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from unirl_core.tracking.mlflow_runs import tracking_uri

    name, alias, version = parse(uri)
    client = MlflowClient(tracking_uri())
    try:
        found = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, version)
    except MlflowException as exc:
        known = ""
        try:
            model = client.get_registered_model(name)
            known = f"; {name} has aliases {sorted(model.aliases) or 'none'}"
        except MlflowException:
            known = f"; no registered model {name!r} in {tracking_uri()}"
        raise ModelVersionError(f"{uri}: not found ({str(exc).splitlines()[0][:120]}){known}") from None
    return name, str(found.version)


def download(uri: str) -> tuple[Path, str]:
    """The local folder of the version `uri` names (downloaded on first use), and its version number."""
    from mlflow.tracking import MlflowClient

    from unirl_core.tracking.mlflow_runs import tracking_uri
    from unirl_core.workspace import workspace

    name, version = resolve_version(uri)
    server = hashlib.sha256(tracking_uri().encode()).hexdigest()[:8]  # version 1 of another server is another model
    folder = workspace().root / "models" / "registered" / server / name / version
    if not folder.is_dir():
        source = MlflowClient(tracking_uri()).get_model_version(name, version).source
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=folder.parent))
        try:
            import mlflow.artifacts

            mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=str(staging),
                                                tracking_uri=tracking_uri())  # fmt: skip
            files = staging / Path(source.rstrip("/")).name
            (files if files.is_dir() else staging).rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder, version


def alias_version(name: str, alias: str) -> str | None:
    """The version number `alias` of registered model `name` names, or None (no such alias, or no such model)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from unirl_core.tracking.mlflow_runs import tracking_uri

    try:
        return str(MlflowClient(tracking_uri()).get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def record_decision(name: str, version: str, tags: dict[str, str], note: str, alias: str | None = None) -> None:
    """Tag version `version` of `name` with a promotion decision, add `note` to its description, and (promoted)
    point `alias` at it."""
    from mlflow.tracking import MlflowClient

    from unirl_core.tracking.mlflow_runs import tracking_uri

    client = MlflowClient(tracking_uri())
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    description = client.get_model_version(name, version).description or ""
    client.update_model_version(name, version, description=f"{description}\n\n{note}".strip())
    if alias is not None:
        client.set_registered_model_alias(name, alias, version)
