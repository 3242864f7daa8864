"""`make ui-check`: run the demo against real Prefect and MLflow servers, open its pages in headless Chromium and
check that each shows what a user looks for, with data, not a spinner.

A fresh scratch workspace and Prefect home (`$UNIRL_HOME/ui-check/workspace`, `.../prefect-home`), both servers on
free loopback ports (flows/serve.py) with their serve record written, as `unirl serve` does, so the demo links the
two UIs; then `unirl demo` (a few minutes on a CPU). With `--served`, the pages of a demo that already ran against
this workspace's live `unirl serve` are checked instead, without running anything.

Each page is polled (its DOM read through the DevTools protocol, about once a second) until every check of the page
passes or `--timeout` seconds pass, then screenshotted to `$UNIRL_HOME/ui-check/<page>.png`. The checks are
functions of the page's DOM (HTML text, parsed here) and of what the APIs say the demo logged, so
tests/unit/test_ui_check.py feeds them broken pages. `--break PAGE` points one page at a run, artifact or model
version that does not exist, to see that check fail. Needs Debian's `chromium` package.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from ui_pages import (  # noqa: E402  (the page checks: tools/ui_pages.py)
    Element,
    Verdict,
    artifact_list,
    axis_reads_values,
    charts_lead_with,
    legible_image,
    mlflow_prefect_link,
    mlflow_run,
    model_training_side,
    parse,
    pipeline_summary,
    prefect_api_tag,
    prefect_flow_run,
    prefect_mlflow_link,
    registered_model,
    reward_chart,
    sample_image,
)

from unirl_core.tracking.mlflow_ui import MIN_GRID_WIDTH, metric_key, page_url  # noqa: E402

DEMO = "pipeline_demo"  # the demo recipe's name: its run name and output folder
MODEL, ALIAS = f"unirl-{DEMO}", "candidate"  # the model version the demo registers, and its alias
REWARD, LOSS = metric_key("reward_mean"), metric_key("loss")  # their MLflow keys (reward/reward_mean, train/loss)
# the run's chart search (a regex, on the key or the title): the reward and loss charts and the samples card
CHART_FILTER = "^(reward/reward_mean|reward_mean|train/loss|loss|samples)$"
NO_RUN, NO_UUID = "0" * 32, "00000000-0000-0000-0000-000000000000"  # ids of nothing, for --break
BREAKABLE = ("prefect-pipeline-run", "prefect-pipeline-summary", "mlflow-chart-order", "mlflow-run-charts",
             "mlflow-sample-image", "mlflow-artifacts", "mlflow-registered-model", "mlflow-run-overview",
             "prefect-train-summary")  # fmt: skip


# ---------------------------------------------------------------- the browser: Chromium over the DevTools protocol

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip

# The DOM as HTML, each <img> annotated with its loaded width (0: not loaded, or broken).
DUMP_JS = """(() => {
  for (const img of document.images) img.setAttribute('data-natural-width', img.complete ? img.naturalWidth : 0);
  return document.documentElement.outerHTML;
})()"""


class Browser:
    """One headless Chromium tab, driven over its DevTools websocket (websockets ships with Prefect)."""

    def __init__(self, width: int = 1600, height: int = 1200):
        from websockets.sync.client import connect

        port, self.profile = free_port(), tempfile.mkdtemp(prefix="ui-check-chromium-")
        self.process = subprocess.Popen(
            ["chromium", *FLAGS, f"--user-data-dir={self.profile}", f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.ws = connect(self._page_socket(port), max_size=None, open_timeout=60)
        self.ids = itertools.count(1)
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _page_socket(self, port: int, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as response:
                    return next(t["webSocketDebuggerUrl"] for t in json.load(response) if t["type"] == "page")
            except (OSError, StopIteration):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"chromium's DevTools did not answer on port {port}") from None
                time.sleep(0.5)

    def send(self, method: str, **params) -> dict:
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:  # events of domains never enabled do not come; skip any that do
            message = json.loads(self.ws.recv(timeout=120))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def open(self, url: str) -> None:
        self.send("Page.navigate", url="about:blank")  # a hash route reloads too: no state from the last page
        self.send("Page.navigate", url=url)

    def evaluate(self, script: str):
        return self.send("Runtime.evaluate", expression=script, returnByValue=True)["result"].get("value")

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        self.ws.close()
        os.killpg(self.process.pid, signal.SIGTERM)  # chromium and its renderers: the group it leads
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


# ---------------------------------------------------------------- the pages of the demo and their checks

# Run before each look at an MLflow page: close the assistant panel; on the charts, search the two cards.
CLOSE_ASSISTANT = "document.querySelector('[data-component-id=\"mlflow.assistant.chat_panel.close\"]')?.click();"
FILTER_CHARTS = (
    CLOSE_ASSISTANT
    + f"const filter = {json.dumps(CHART_FILTER)};"
    + """
const box = document.querySelector('input[placeholder="Search metric charts"]');
if (box && box.value !== filter) {
  Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(box, filter);
  box.dispatchEvent(new Event('input', {bubbles: true}));
}"""
)
OPEN_SAMPLES = (
    FILTER_CHARTS
    + """
const card = [...document.querySelectorAll('[data-testid="experiment-view-compare-runs-card"]')]
  .find(c => c.querySelector('h4[title="samples"]'));
if (card && !document.querySelector('[role="dialog"]'))
  card.querySelector('[data-component-id="fullscreen_button_chartcard"]')?.click();"""
)


@dataclass(frozen=True)
class Demo:
    """What the APIs say the demo put in the UIs: what each page must show."""

    prefect_url: str
    mlflow_url: str
    run_id: str  # the training run
    experiment_id: str
    reward_points: int  # reward_mean values logged
    artifacts: tuple[str, ...]  # samples/<grid>.png ..., recipe.yaml
    version: str  # the model version with the alias
    description: str  # its description
    flow_run_url: str  # the training run's tags: its Prefect flow run
    flow_run_name: str
    pipeline_run: tuple[str, str]  # (id, name) of the pipeline flow run
    pipeline_summary: str  # artifact ids
    train_summary: str
    prefect_api_url: str = ""  # the training run's tag: the Prefect API its flow run ran against

    @property
    def run_url(self) -> str:
        """The run page as every link of ours opens it: on the UI's machine-learning side."""
        return self.run_tab("")

    def run_tab(self, tab: str, run_id: str | None = None) -> str:
        route = f"experiments/{self.experiment_id}/runs/{run_id or self.run_id}/{tab}"
        return page_url(self.mlflow_url, route.rstrip("/"))


@dataclass(frozen=True)
class Page:
    name: str  # its screenshot: <name>.png
    url: str
    broken_url: str  # a run, artifact or model version that does not exist (--break)
    checks: tuple[tuple[str, Callable[[Element], Verdict]], ...]
    prepare: str = ""  # JS run before each look


def pages(demo: Demo) -> list[Page]:
    """The pages that need no link followed, in order."""
    d = demo
    first_grid = next(a for a in d.artifacts if a.startswith("samples/"))
    pipeline_id, pipeline_name = d.pipeline_run
    return [
        Page("prefect-pipeline-run", f"{d.prefect_url}/runs/flow-run/{pipeline_id}",
             f"{d.prefect_url}/runs/flow-run/{NO_UUID}",
             (("Prefect shows the pipeline flow run, Completed",
               lambda p: prefect_flow_run(p, pipeline_name, "pipeline")),)),
        Page("prefect-pipeline-summary", f"{d.prefect_url}/artifacts/artifact/{d.pipeline_summary}",
             f"{d.prefect_url}/artifacts/artifact/{NO_UUID}",
             (("Prefect pipeline-summary artifact: stage table and model",
               lambda p: pipeline_summary(p, ("ingest", "precache", "train"), MODEL, ALIAS)),)),
        Page("mlflow-chart-order", d.run_tab("model-metrics"), d.run_tab("model-metrics", NO_RUN),
             (("MLflow's charts tab leads with the reward chart", lambda p: charts_lead_with(p, REWARD)),),
             CLOSE_ASSISTANT),
        Page("mlflow-run-charts", d.run_tab("model-metrics"), d.run_tab("model-metrics", NO_RUN),
             (("MLflow reward chart plots every logged step", lambda p: reward_chart(p, REWARD, d.reward_points)),
              ("MLflow loss axis prints distinct values", lambda p: axis_reads_values(p, LOSS)),
              ("MLflow image card shows a loaded sample grid", lambda p: sample_image(p, d.run_id))),
             FILTER_CHARTS),
        Page("mlflow-sample-image", d.run_tab("model-metrics"), d.run_tab("model-metrics", NO_RUN),
             (("MLflow image card, enlarged, shows the sample grid",
               lambda p: sample_image(p.find(role="dialog") or Element("none", {}), d.run_id)),
              (f"that grid is at least {MIN_GRID_WIDTH} px wide",
               lambda p: legible_image(p.find(role="dialog") or Element("none", {}), d.run_id, MIN_GRID_WIDTH))),
             OPEN_SAMPLES),
        Page("mlflow-artifacts", d.run_tab(f"artifacts/{first_grid}"), d.run_tab("artifacts", NO_RUN),
             (("MLflow artifacts list the sample grids and recipe.yaml",
               lambda p: artifact_list(p, d.artifacts, first_grid)),
              (f"the grid previewed is at least {MIN_GRID_WIDTH} px wide",
               lambda p: artifact_width(p, first_grid))), CLOSE_ASSISTANT),
        Page("mlflow-registered-model", page_url(d.mlflow_url, f"models/{MODEL}/versions/{d.version}"),
             page_url(d.mlflow_url, f"models/{MODEL}/versions/999"),
             (("MLflow model version: alias, description, signature",
               lambda p: registered_model(p, MODEL, ALIAS, d.description)),), CLOSE_ASSISTANT),
    ]  # fmt: skip


def artifact_width(page: Element, previewed: str) -> Verdict:
    """The artifact view's preview of `previewed` is a grid at least MIN_GRID_WIDTH pixels wide."""
    widths = [int(img.attrs.get("data-natural-width") or 0) for img in page.find_all("img", alt=previewed)]
    widest = max(widths, default=0)
    return Verdict(widest >= MIN_GRID_WIDTH, f"{previewed} previewed {widest} px wide (want >= {MIN_GRID_WIDTH})")


def linked_pages(demo: Demo) -> list[tuple[Page, Page]]:
    """(a page with a link, the page it opens), each checked in turn: the link's page URL is the href found."""
    d = demo
    return [
        (Page("mlflow-run-overview", d.run_url, d.run_tab("", NO_RUN),
              (("MLflow opens the experiment as model training", model_training_side),
               ("MLflow run shows the Prefect API its flow run ran against",
                lambda p: prefect_api_tag(p, d.prefect_api_url)),
               ("MLflow run description links its Prefect flow run",
                lambda p: mlflow_prefect_link(p, d.flow_run_url, d.flow_run_name))), CLOSE_ASSISTANT),
         Page("prefect-linked-flow-run", "", "",
              (("that link opens the Prefect train flow run",
                lambda p: prefect_flow_run(p, d.flow_run_name, "train", d.pipeline_run[1], "(rl round 0): reward")),))),
        (Page("prefect-train-summary", f"{d.prefect_url}/artifacts/artifact/{d.train_summary}",
              f"{d.prefect_url}/artifacts/artifact/{NO_UUID}",
              (("Prefect train-summary artifact links the MLflow run", lambda p: prefect_mlflow_link(p, d.run_url)),)),
         Page("mlflow-linked-run", "", "",
              (("that link opens the MLflow run page", lambda p: mlflow_run(p, d.run_id, DEMO)),), CLOSE_ASSISTANT)),
    ]  # fmt: skip


def look(browser: Browser, page: Page, url: str, out: Path, timeout: float) -> list[tuple[str, Verdict]]:
    """Open `url` and read its DOM about once a second until every check of `page` passes or `timeout` passes;
    screenshot it either way. The last verdicts."""
    browser.open(url)
    deadline = time.monotonic() + timeout
    while True:
        if page.prepare:
            browser.evaluate(f"(() => {{ {page.prepare} }})()")
        dom = parse(browser.evaluate(DUMP_JS) or "")
        verdicts = [(label, check(dom)) for label, check in page.checks]
        if all(v.ok for _, v in verdicts) or time.monotonic() > deadline:
            break
        time.sleep(1)
    time.sleep(1)  # let the last frame paint (plotly's transition, an image decoding)
    browser.screenshot(out / f"{page.name}.png")
    return verdicts


def check_pages(demo: Demo, out: Path, broken: str | None, timeout: float) -> list[tuple[str, Verdict]]:
    results: list[tuple[str, Verdict]] = []
    browser = Browser()
    try:
        for page in pages(demo):
            results += look(browser, page, page.broken_url if broken == page.name else page.url, out, timeout)
        for source, target in linked_pages(demo):
            found = look(browser, source, source.broken_url if broken == source.name else source.url, out, timeout)
            results += found
            link = found[-1][1].link
            if link is None:
                results += [(label, Verdict(False, "no link to open")) for label, _ in target.checks]
                continue
            results += look(browser, target, link, out, timeout)
    finally:
        browser.close()
    return results


# ---------------------------------------------------------------- the demo: servers, run, what it logged


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def scratch_servers(out: Path) -> Iterator:
    """A fresh workspace and Prefect home under `out`, the servers on free ports and their serve record (so the
    demo's MLflow run and Prefect artifacts link the served UIs); everything stopped after the block."""
    from flows.serve import Servers, write_record

    for folder in ("workspace", "prefect-home"):
        shutil.rmtree(out / folder, ignore_errors=True)
    os.environ["UNIRL_HOME"], os.environ["PREFECT_HOME"] = str(out / "workspace"), str(out / "prefect-home")
    servers, record = Servers(free_port(), free_port(), worker=False), None
    try:
        servers.start()
        record = write_record(servers)
        yield servers
    finally:
        if record is not None:
            record.unlink(missing_ok=True)
        servers.stop()


def run_demo(prefect_url: str, log: Path) -> bool:
    """`unirl demo` against the Prefect server, its MLflow runs in the (served) workspace database."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the served workspace's runs
    env["PREFECT_API_URL"] = f"{prefect_url}/api"
    with log.open("w") as output:
        done = subprocess.run([str(Path(sys.executable).parent / "unirl"), "demo"], env=env, stdout=output,
                              stderr=subprocess.STDOUT, timeout=1800, check=False)  # fmt: skip
    return done.returncode == 0


def read_demo(prefect_url: str, mlflow_url: str) -> Demo:
    """What the demo logged, from the MLflow and Prefect APIs (the pages must show it)."""
    from mlflow.tracking import MlflowClient

    from unirl_core.workspace import workspace

    client = MlflowClient(mlflow_url)
    run_id = json.loads((workspace().outputs / DEMO / "mlflow_run.json").read_text())["run_id"]
    run = client.get_run(run_id)
    grids = sorted(a.path for a in client.list_artifacts(run_id, "samples") if a.path.endswith(".png"))
    version = client.get_model_version_by_alias(MODEL, ALIAS)
    pipeline_run, summaries = read_prefect(f"{prefect_url}/api")
    return Demo(
        prefect_url=prefect_url, mlflow_url=mlflow_url, run_id=run_id, experiment_id=run.info.experiment_id,
        reward_points=len(client.get_metric_history(run_id, REWARD)), artifacts=(*grids, "recipe.yaml"),
        version=version.version, description=version.description or "",
        flow_run_url=run.data.tags.get("prefect.flow_run_url", ""),
        flow_run_name=run.data.tags.get("prefect.flow_run_name", ""),
        prefect_api_url=run.data.tags.get("prefect.api_url", ""),
        pipeline_run=pipeline_run, pipeline_summary=summaries["pipeline-summary"],
        train_summary=summaries["train-summary"],
    )  # fmt: skip


def read_prefect(api_url: str) -> tuple[tuple[str, str], dict[str, str]]:
    """((id, name) of the latest pipeline flow run, {artifact key: id of its latest version})."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import ArtifactSort, FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def read():
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["pipeline"])),
                                               sort=FlowRunSort.START_TIME_DESC, limit=1)  # fmt: skip
            artifacts = {}
            for key in ("pipeline-summary", "train-summary"):
                found = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                                    sort=ArtifactSort.CREATED_DESC, limit=1)  # fmt: skip
                artifacts[key] = str(found[0].id)
            return (str(runs[0].id), runs[0].name), artifacts

    with temporary_settings({PREFECT_API_URL: api_url}):
        return asyncio.run(read())


# ---------------------------------------------------------------- main


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--served",
        action="store_true",
        help="check the demo already run against this workspace's live `unirl serve`; run nothing",
    )
    parser.add_argument(
        "--break",
        dest="broken",
        choices=BREAKABLE,
        help="point this page at a run/artifact/model version that does not exist: its checks fail",
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds each page may take to show its data")
    return parser.parse_args(argv)


def check_scratch_demo(out: Path, args: argparse.Namespace) -> list[tuple[str, Verdict]] | None:
    """Run the demo against fresh servers and check its pages; None when the demo failed."""
    started = time.monotonic()
    with scratch_servers(out) as servers:
        if not run_demo(servers.prefect_url, out / "demo.log"):
            print(f"FAIL unirl demo (its output: {out / 'demo.log'})")
            print((out / "demo.log").read_text()[-3000:])
            return None
        print(f"ok   unirl demo ({time.monotonic() - started:.0f} s)")
        return check_pages(read_demo(servers.prefect_url, servers.mlflow_url), out, args.broken, args.timeout)


def check_served(out: Path, args: argparse.Namespace) -> list[tuple[str, Verdict]] | None:
    """Check the pages of the demo already run against this workspace's live `unirl serve`."""
    from unirl_core.workspace import workspace

    record = workspace().served()
    if record is None:
        print("--served: no live `unirl serve` for this workspace", file=sys.stderr)
        return None
    demo = read_demo(record["prefect_api_url"].removesuffix("/api"), record["mlflow_url"])
    return check_pages(demo, out, args.broken, args.timeout)


def main(argv: Sequence[str] | None = None) -> int:
    from unirl_core.workspace import workspace

    args = arguments(argv)
    if not shutil.which("chromium"):
        print("ui-check needs Debian's chromium package: apt-get install chromium", file=sys.stderr)
        return 2
    out = workspace().ensure().root / "ui-check"
    out.mkdir(exist_ok=True)
    for old in out.glob("*.png"):  # no screenshot of an earlier run passes for this one's
        old.unlink()
    started = time.monotonic()
    results = (check_served if args.served else check_scratch_demo)(out, args)
    if results is None:
        return 1
    for label, verdict in results:
        print(f"{'ok  ' if verdict.ok else 'FAIL'} {label}: {verdict.detail}")
    print(f"screenshots: {out} ({time.monotonic() - started:.0f} s in all)")
    return 0 if all(v.ok for _, v in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
