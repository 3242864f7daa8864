"""The environment a worker on another node needs, taken from the driver's (a pure function of recipe + environ).

Two channels, because Ray writes a runtime_env's values into its own `runtime_env_agent.log` on every node:
- `runtime_env()`, set when the worker process starts: UNIRL_HOME (the driver's workspace, resolved),
  HF_HUB_OFFLINE (read when huggingface_hub is imported) and `train.ray.env_vars`;
- `secrets`, set by an actor call before the process group and the model are built, never in a runtime_env:
  MLFLOW_TRACKING_URI, the recipe's credential names (a remote scorer's `auth_header_env`) and
  `train.ray.secret_env_vars`. A name in both lists is a secret.

Without UNIRL_HOME a worker resolves the default `./.unirl` in its raylet's folder and builds a second workspace
there. Values never leave this object except to the workers: `describe()`, `repr()` and the recipe's params
(`train.ray.*`) hold names only. A listed name unset in the driver's environment is left out with a warning (the
node may set it itself, e.g. a KubeRay pod's env).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from unirl_core.workspace import DEFAULT_HOME

logger = logging.getLogger(__name__)

PROCESS_ENV = ("HF_HUB_OFFLINE",)  # read when huggingface_hub is imported: must be there at process start
SECRET_ENV = ("MLFLOW_TRACKING_URI",)  # a tracking URI can carry a password (postgresql://user:pw@host/db)


@dataclass(frozen=True)
class WorkerEnv:
    env_vars: dict[str, str] = field(default_factory=dict, repr=False)
    secrets: dict[str, str] = field(default_factory=dict, repr=False)
    working_dir: str | None = None
    missing: tuple[str, ...] = ()

    def runtime_env(self) -> dict:
        """Ray's runtime_env of every worker actor: the process-start variables and the working directory."""
        runtime_env = {"env_vars": dict(self.env_vars), "working_dir": self.working_dir}
        return {key: value for key, value in runtime_env.items() if value}

    def describe(self) -> dict:
        """The loggable form: names only."""
        return {
            "env_vars": sorted(self.env_vars),
            "secret_env_vars": sorted(self.secrets),
            "working_dir": self.working_dir,
            "missing": list(self.missing),
        }

    def __repr__(self) -> str:
        return f"WorkerEnv({self.describe()})"


def worker_env(ray_config, credential_names: Iterable[str], environ: Mapping[str, str]) -> WorkerEnv:
    """The variables to forward, with their values from `environ` (the driver's); `credential_names`: the names the
    recipe's components read credentials from on the workers."""
    home = str(Path(environ.get("UNIRL_HOME") or DEFAULT_HOME).expanduser().resolve())
    secret = [*SECRET_ENV, *credential_names, *ray_config.secret_env_vars]
    public = [name for name in (*PROCESS_ENV, *ray_config.env_vars) if name not in secret]  # a secret stays one
    named = set(ray_config.env_vars) | set(ray_config.secret_env_vars) | set(credential_names)
    env_vars = {"UNIRL_HOME": home} | {name: environ[name] for name in public if name in environ}
    secrets = {name: environ[name] for name in secret if name in environ}
    missing = tuple(sorted(name for name in named if name not in environ))
    if missing:
        logger.warning("not set in this environment, so not forwarded to the Ray workers: %s", ", ".join(missing))
    working_dir = str(Path(ray_config.working_dir).expanduser().resolve()) if ray_config.working_dir else None
    return WorkerEnv(env_vars, secrets, working_dir, missing)


def adopt_secrets(worker, secrets: dict[str, str]) -> None:
    """Runs inside a worker actor (`actor.__ray_call__`): set the forwarded credentials in its environment."""
    os.environ.update(secrets)
