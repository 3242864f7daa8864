"""`unirl serve` as a user runs it, and the deployments against what it started (a real Prefect server, a real process
worker and an MLflow server, on free loopback ports), one server for the module, its tests in order:

1. the servers answer on 127.0.0.1 only, the worker joins, and another command of the workspace runs its flow on this
   Prefect server (no temporary one);
2. `prefect deploy` applies deployments/prefect.yaml; the pipeline deployment runs to completion and fills MLflow; its
   ingest's `unirl.dataset.updated` event triggers `retrain`, whose nightly schedule has upcoming runs, and
   `bagel-export` of that dataset; cancelling the running retrain leaves no Ray process behind;
3. SIGTERM stops every process `unirl serve` started."""

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

from unirl_core.tracking.mlflow_ui import metric_key

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
BIN = Path(sys.executable).parent
UNIRL = str(BIN / "unirl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`unirl serve` started once; the last test stops it (SIGTERM), else this does at the end."""
    from unirl_core.data.synthetic import synthetic_prompts, write_synthetic_parquet

    root = tmp_path_factory.mktemp("deployments")
    (root / "prompts.txt").write_text("\n".join(synthetic_prompts(16)))
    prefect_port, mlflow_port = free_port(), free_port()
    env = {
        **os.environ,
        "UNIRL_HOME": str(root / "home"),
        "PREFECT_HOME": str(root / "prefect"),
        "UNIRL_PROJECT_DIR": str(ROOT),
        "INPUT_PARQUET": write_synthetic_parquet(str(root / "synthetic.parquet"), rows=16),
        "DATA_PATH": str(root / "prompts.txt"),
        "OUTPUT_DIR": str(root / "retrain-out"),  # retrain's training (the pipeline run gets its own below)
        "PREFECT_API_URL": f"http://127.0.0.1:{prefect_port}/api",
        "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{mlflow_port}",
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # the worker picks a new run up within a second, not Prefect's 10
    }
    workspace_env = {k: v for k, v in env.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    server = subprocess.Popen(
        [UNIRL, "serve", "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port)],
        env=workspace_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any("Ctrl-C" in line for line in lines):
        line = server.stdout.readline()
        assert line or server.poll() is None, "".join(lines)
        lines.append(line)
    assert any("Ctrl-C" in line for line in lines), "".join(lines)
    served = {"root": root, "env": env, "workspace_env": workspace_env, "process": server, "output": "".join(lines),
              "ports": (prefect_port, mlflow_port)}  # fmt: skip
    try:
        yield served
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=90)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_serve_answers_on_loopback_with_a_worker_and_commands_of_the_workspace_use_its_prefect(served, tmp_path):
    (prefect_port, mlflow_port), output = served["ports"], served["output"]
    assert f"Prefect UI:  http://127.0.0.1:{prefect_port}" in output, output
    assert f"MLflow UI:   http://127.0.0.1:{mlflow_port}" in output, output
    assert answers(f"http://127.0.0.1:{prefect_port}/api/health")
    with urllib.request.urlopen(f"http://127.0.0.1:{prefect_port}/ui-settings", timeout=5) as response:
        assert json.loads(response.read())["api_url"] == f"http://127.0.0.1:{prefect_port}/api"  # the UI's API
    assert answers(f"http://127.0.0.1:{mlflow_port}/health")
    time.sleep(2)  # the worker starts after both servers answer
    children = psutil.Process(served["process"].pid).children(recursive=True)
    assert any("worker" in " ".join(c.cmdline()) for c in children)
    listening = [c for c in psutil.net_connections(kind="inet")
                 if c.status == "LISTEN" and c.laddr.port in served["ports"]]  # fmt: skip
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
    # a command of the same workspace (no PREFECT_API_URL) runs its flow on this server: no temporary one, no wait
    (tmp_path / "p.txt").write_text("a\nb\n")
    check = subprocess.run([UNIRL, "prompts", "check", str(tmp_path / "p.txt")], env=served["workspace_env"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stderr
    [log] = (served["root"] / "home" / "logs").glob("*-prompts-*.log")
    assert "Starting temporary server" not in log.read_text()
    request = urllib.request.Request(f"http://127.0.0.1:{prefect_port}/api/flow_runs/filter", data=b"{}",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:
        assert [run["name"] for run in json.loads(response.read())]  # the check's flow run, in this server


def client_call(env: dict, coroutine_factory):
    """Run `coroutine_factory(client)` against the served Prefect API."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def main():
        async with get_client() as client:
            return await coroutine_factory(client)

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        return asyncio.run(main())


def runs_of(env: dict, deployment: str) -> list:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    async def read(client):
        found = await client.read_deployment_by_name(deployment)
        return await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found.id])))

    return client_call(env, read)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def test_deployments_run_trigger_schedule_and_cancel(served):
    from mlflow.tracking import MlflowClient

    root, env = served["root"], served["env"]
    deploy = subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    overrides = [f"train.output_dir={root / 'pipeline-out'}", "train.warmup.steps=2", "train.warmup.batch_size=4",
                 "train.steps=2", "train.steps_per_round=2", "train.eval_every_rounds=0"]  # fmt: skip
    started = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "pipeline-recipe/pipeline", "--param", "recipe=pipeline_demo",
         "--param", f"overrides={json.dumps(overrides)}", "--job-variable", 'env={"RAY_AUTH_MODE": "disabled"}'],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr

    def pipeline_finished():
        states = [r.state_name for r in runs_of(env, "pipeline-recipe/pipeline")]
        assert not {"Failed", "Crashed"} & set(states), states
        return "Completed" in states

    wait_for(pipeline_finished, 300, "the pipeline deployment's run")

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    record = json.loads((root / "pipeline-out" / "mlflow_run.json").read_text())
    run = client.get_run(record["run_id"])
    assert len(client.get_metric_history(run.info.run_id, metric_key("reward_mean"))) == 2
    assert run.data.tags["prefect.flow_run_id"]
    assert client.get_model_version_by_alias("unirl-pipeline_demo", "candidate").run_id == run.info.run_id
    champion = client.get_model_version_by_alias("unirl-pipeline_demo", "champion")  # the gate ran: the first version
    assert champion.run_id == run.info.run_id and champion.tags["unirl.promotion"] == "promoted"

    # the pipeline's ingest committed a new dataset -> its event triggered retrain (not a scheduled run)
    triggered = wait_for(
        lambda: [r for r in runs_of(env, "pipeline-recipe/retrain") if not r.auto_scheduled], 60, "a triggered retrain"
    )
    upcoming = [r for r in runs_of(env, "pipeline-recipe/retrain") if r.auto_scheduled and r.state_name == "Scheduled"]
    assert upcoming and all(r.expected_start_time.hour == 3 for r in upcoming)  # the nightly cron

    # the same event exported the dataset to BAGEL's format, its resource rendered into the `source` parameter
    exported = wait_for(lambda: [r for r in runs_of(env, "bagel-export/bagel-export") if r.state_name == "Completed"],
                        180, "the triggered BAGEL export")  # fmt: skip
    source = exported[0].parameters["source"]
    assert "{{" not in source and (Path(source) / "shards").is_dir(), source
    info = json.loads((Path(f"{source}-bagel") / "t2i" / "dataset_info.json").read_text())
    assert info["num_total_samples"] > 0

    # retrain reaches its training rounds (Ray up), then is cancelled: nothing of its Ray is left running
    record_path = root / "retrain-out" / "ray_processes.json"
    wait_for(record_path.is_file, 300, "retrain's training round to start Ray")
    recorded = json.loads(record_path.read_text())
    cancel = subprocess.run([str(BIN / "prefect"), "flow-run", "cancel", str(triggered[0].id)], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    wait_for(lambda: [r for r in runs_of(env, "pipeline-recipe/retrain") if r.state_name == "Cancelled"], 120,
             "the cancelled state")  # fmt: skip

    def ray_gone():
        return not [e for e in recorded["processes"] if psutil.pid_exists(e["pid"])]

    wait_for(ray_gone, 30, "the cancelled run's Ray processes to exit")


def test_sigterm_stops_every_process_serve_started(served):
    process = served["process"]
    children = psutil.Process(process.pid).children(recursive=True)
    assert children
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=90)
    time.sleep(1)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert process.returncode == 0
