"""`make ui-check`: open the demo run's pages in headless Chromium and check they render.

Starts the Prefect and MLflow servers on free loopback ports (flows/serve.py), runs `unirl demo` against them (a
no-op re-run when the workspace already holds the demo: its flow run and artifacts still appear), then loads the
Prefect flow-run page, the pipeline summary artifact and the MLflow run's metric charts, checks their rendered DOM
for what a user looks for, and saves screenshots under `$UNIRL_HOME/ui-check/`. Needs Debian's `chromium` package.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium(url: str, screenshot: Path, wait_ms: int = 20000) -> str:
    """The DOM after `wait_ms` of (virtual) page time, and a screenshot of the page."""
    base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,1000",
            f"--virtual-time-budget={wait_ms}"]  # fmt: skip
    subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True, timeout=180, check=False)
    dom = subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=False)
    return dom.stdout


def latest_artifact_id(api_url: str, key: str) -> str:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def read():
        async with get_client() as client:
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC,
                limit=1,
            )  # fmt: skip
            return str(found[0].id)

    with temporary_settings({PREFECT_API_URL: api_url}):
        return asyncio.run(read())


def latest_pipeline_run(api_url: str) -> str:
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def read():
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["pipeline"])),
                sort=FlowRunSort.START_TIME_DESC,
                limit=1,
            )
            return str(runs[0].id)

    with temporary_settings({PREFECT_API_URL: api_url}):
        return asyncio.run(read())


def main() -> int:
    from flows.serve import Servers
    from unirl_core.workspace import workspace

    if not shutil.which("chromium"):
        print("ui-check needs Debian's chromium package: apt-get install chromium", file=sys.stderr)
        return 2
    ws = workspace().ensure()
    out = ws.root / "ui-check"
    out.mkdir(parents=True, exist_ok=True)
    servers = Servers(free_port(), free_port(), worker=False)
    servers.start()
    checks: list[tuple[str, bool]] = []
    try:
        env = {**os.environ, "PREFECT_API_URL": f"{servers.prefect_url}/api"}
        demo = subprocess.run([str(Path(sys.executable).parent / "unirl"), "demo"], env=env, capture_output=True,
                              text=True, timeout=1200)  # fmt: skip
        checks.append(("unirl demo completes", demo.returncode == 0))
        if demo.returncode != 0:
            print(demo.stdout[-3000:], demo.stderr[-3000:])
            return 1
        flow_run = latest_pipeline_run(f"{servers.prefect_url}/api")
        page = chromium(f"{servers.prefect_url}/runs/flow-run/{flow_run}", out / "prefect-flow-run.png")
        checks.append(("Prefect flow-run page shows the pipeline run", "pipeline" in page and "Completed" in page))
        artifact = latest_artifact_id(f"{servers.prefect_url}/api", "pipeline-summary")
        page = chromium(f"{servers.prefect_url}/artifacts/artifact/{artifact}", out / "prefect-summary-artifact.png")
        checks.append(("Prefect shows the pipeline-summary artifact", "registered model" in page))

        from mlflow.tracking import MlflowClient

        run_id = json.loads((ws.root / "outputs" / "pipeline_demo" / "mlflow_run.json").read_text())["run_id"]
        experiment = MlflowClient(servers.mlflow_url).get_run(run_id).info.experiment_id
        url = f"{servers.mlflow_url}/#/experiments/{experiment}/runs/{run_id}/model-metrics"
        page = chromium(url, out / "mlflow-run-metrics.png", wait_ms=60000)
        checks.append(("MLflow run page lists the metrics", "reward_mean" in page or "Model metrics" in page))
        checks.append(("MLflow draws a metric chart", "<canvas" in page or "main-svg" in page or "<svg" in page))
    finally:
        servers.stop()
    for name, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"screenshots: {out}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
