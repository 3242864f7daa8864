"""`unirl serve` as a user runs it: the Prefect and MLflow servers answer on 127.0.0.1 only, the worker joins, other
commands of the workspace run their flows on its Prefect server, and SIGTERM stops every process it started."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow
UNIRL = str(Path(sys.executable).parent / "unirl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_serve_starts_prefect_mlflow_and_a_worker_on_loopback_and_stops_them_on_sigterm(tmp_path):
    prefect_port, mlflow_port = free_port(), free_port()
    env = {**os.environ, "UNIRL_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    process = subprocess.Popen(
        [UNIRL, "serve", "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    children = []
    try:
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not any("Ctrl-C" in line for line in lines):
            line = process.stdout.readline()
            assert line or process.poll() is None, "".join(lines)
            lines.append(line)
        output = "".join(lines)
        assert f"Prefect UI:  http://127.0.0.1:{prefect_port}" in output, output
        assert f"MLflow UI:   http://127.0.0.1:{mlflow_port}" in output, output
        assert answers(f"http://127.0.0.1:{prefect_port}/api/health")
        with urllib.request.urlopen(f"http://127.0.0.1:{prefect_port}/ui-settings", timeout=5) as response:
            assert json.loads(response.read())["api_url"] == f"http://127.0.0.1:{prefect_port}/api"  # the UI's API
        assert answers(f"http://127.0.0.1:{mlflow_port}/health")
        time.sleep(2)  # the worker starts after both servers answer
        children = psutil.Process(process.pid).children(recursive=True)
        assert any("worker" in " ".join(c.cmdline()) for c in children)
        ports = {prefect_port, mlflow_port}
        listening = [c for c in psutil.net_connections(kind="inet") if c.status == "LISTEN" and c.laddr.port in ports]
        assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
        # a command of the same workspace runs its flow on this server (no temporary one, no start-up wait)
        (tmp_path / "p.txt").write_text("a\nb\n")
        check = subprocess.run([UNIRL, "prompts", "check", str(tmp_path / "p.txt")], env=env, capture_output=True,
                               text=True, timeout=120)  # fmt: skip
        assert check.returncode == 0, check.stderr
        [log] = (tmp_path / "home" / "logs").glob("*-prompts-*.log")
        assert "Starting temporary server" not in log.read_text()
        request = urllib.request.Request(f"http://127.0.0.1:{prefect_port}/api/flow_runs/filter", data=b"{}",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as response:
            assert [run["name"] for run in json.loads(response.read())]  # the check's flow run, in this server
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    time.sleep(1)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert process.returncode == 0
