"""`unirl serve`: the local monitoring servers, bound to 127.0.0.1, stopped together on Ctrl-C or SIGTERM.

    Prefect server + UI      http://127.0.0.1:4200      (`prefect server start`)
    MLflow server + UI       http://127.0.0.1:5000      (`mlflow server`, the workspace's sqlite + artifacts)
    Prefect worker           pool `unirl-process`       (runs the deployments of deployments/prefect.yaml)

Each child runs in its own process group; stopping sends SIGTERM to every group, waits, then SIGKILLs what is left,
so nothing keeps running after `unirl serve` exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def _ready(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


class Servers:
    def __init__(
        self, prefect_port: int = 4200, mlflow_port: int = 5000, worker: bool = True, pool: str = "unirl-process"
    ):
        self.prefect_port, self.mlflow_port, self.worker, self.pool = prefect_port, mlflow_port, worker, pool
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def prefect_url(self) -> str:
        return f"http://{HOST}:{self.prefect_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://{HOST}:{self.mlflow_port}"

    def _start(self, name: str, command: list[str], env: dict[str, str]) -> None:
        self.processes[name] = subprocess.Popen(command, env={**os.environ, **env}, start_new_session=True,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)  # fmt: skip

    def start(self, timeout: float = 180) -> None:
        from unirl_core.workspace import workspace

        ws = workspace().ensure()
        self._start(
            "prefect",
            [_bin("prefect"), "server", "start", "--host", HOST, "--port", str(self.prefect_port), "--analytics-off"],
            {"PREFECT_UI_API_URL": f"{self.prefect_url}/api"},  # else the UI calls port 4200 whatever --port says
        )
        self._start(
            "mlflow",
            [_bin("mlflow"), "server", "--host", HOST, "--port", str(self.mlflow_port), "--workers", "1",
             "--backend-store-uri", f"sqlite:///{ws.mlflow_db}", "--artifacts-destination", ws.mlflow_artifacts.as_uri()],
            {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        waiting = {"prefect": f"{self.prefect_url}/api/health", "mlflow": f"{self.mlflow_url}/health"}
        while waiting and time.monotonic() < deadline:
            for name, url in list(waiting.items()):
                if self.processes[name].poll() is not None:
                    raise RuntimeError(f"the {name} server exited with code {self.processes[name].returncode}")
                if _ready(url):
                    del waiting[name]
            time.sleep(0.5)
        if waiting:
            raise TimeoutError(f"{', '.join(waiting)} not ready within {timeout:.0f} s")
        if self.worker:
            self._start(
                "worker",
                [_bin("prefect"), "worker", "start", "--pool", self.pool, "--type", "process"],
                {"PREFECT_API_URL": f"{self.prefect_url}/api"},
            )
            self._wait_for_pool(deadline)

    def _wait_for_pool(self, deadline: float) -> None:
        """Until the worker has created its work pool: `prefect deploy` right after `serve` is ready (what it prints)
        would otherwise find no pool and fail."""
        url = f"{self.prefect_url}/api/work_pools/{self.pool}"
        while not _ready(url):
            if self.processes["worker"].poll() is not None:
                raise RuntimeError(f"the worker exited with code {self.processes['worker'].returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"work pool {self.pool} not created within the start deadline")
            time.sleep(0.5)

    def stop(self, grace: float = 20) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):  # whatever is left of the group (server workers)
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def serve(prefect_port: int, mlflow_port: int, worker: bool, echo=print) -> None:
    """Start the servers, print where they are, block until SIGINT/SIGTERM, stop everything."""
    servers = Servers(prefect_port, mlflow_port, worker)
    stopping = []

    def on_signal(signum, frame) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    record = None
    try:
        servers.start()
        record = write_record(servers)
        echo(f"Prefect UI:  {servers.prefect_url}   (export PREFECT_API_URL={servers.prefect_url}/api)")
        echo(f"MLflow UI:   {servers.mlflow_url}   (export MLFLOW_TRACKING_URI={servers.mlflow_url})")
        if worker:
            echo(
                f"worker:      pool {servers.pool} (deploy with: prefect deploy --all --prefect-file deployments/prefect.yaml)"
            )
        echo("Ctrl-C stops everything")
        while not stopping:
            for name, process in servers.processes.items():
                if process.poll() is not None:
                    echo(f"{name} exited with code {process.returncode}; stopping")
                    stopping.append(0)
            time.sleep(0.5)
    finally:
        if record is not None:
            record.unlink(missing_ok=True)
        servers.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def write_record(servers: Servers) -> Path:
    """Tell later `unirl` commands of this workspace where the servers are (`Workspace.served`), so a command that
    runs a flow uses this Prefect server instead of starting a temporary one (flows/console.py)."""
    import json

    from unirl_core.io.storage import write_bytes_atomic
    from unirl_core.workspace import workspace

    path = workspace().serve_record
    record = {"pid": os.getpid(), "prefect_api_url": f"{servers.prefect_url}/api", "mlflow_url": servers.mlflow_url}
    write_bytes_atomic(str(path), json.dumps(record).encode())
    return path


def running_prefect_api() -> str | None:
    """The API URL of the Prefect server a live `unirl serve` of this workspace runs, if it answers."""
    from unirl_core.workspace import workspace

    url = str((workspace().served() or {}).get("prefect_api_url", ""))
    return url if url.startswith(f"http://{HOST}:") and _ready(f"{url}/health", timeout=1) else None
