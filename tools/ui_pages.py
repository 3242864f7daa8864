"""The page checks of `make ui-check` (tools/ui_check.py): what a user looks for on each page of the demo in the
Prefect and MLflow UIs, as functions of the page's DOM (HTML text, parsed here with html.parser: no dependency) and
of what the APIs say the demo logged. Each returns a Verdict: a spinner, an icon or a tab label counts for nothing.
tests/unit/test_ui_check.py feeds them trimmed real pages and broken ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlparse

# ---------------------------------------------------------------- the DOM, parsed (html.parser: no dependency)

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass(eq=False)
class Element:
    tag: str
    attrs: dict[str, str]
    parent: Element | None = field(default=None, repr=False)
    children: list[Element | str] = field(default_factory=list, repr=False)

    def iter(self) -> Iterator[Element]:
        for child in self.children:
            if isinstance(child, Element):
                yield child
                yield from child.iter()

    def find_all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Element]:
        """Descendants by tag, by one class token, and by exact attribute values (`data_testid=` matches
        `data-testid`)."""
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            e for e in self.iter()
            if (tag is None or e.tag == tag) and (cls is None or cls in e.attrs.get("class", "").split())
            and all(e.attrs.get(k) == v for k, v in want.items())
        ]  # fmt: skip

    def find(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> Element | None:
        return next(iter(self.find_all(tag, cls, **attrs)), None)

    def text(self) -> str:
        """The visible text, whitespace collapsed (no-break spaces too)."""
        return " ".join(self._raw_text().split())

    def _raw_text(self) -> str:
        return "".join(c if isinstance(c, str) else c._raw_text() for c in self.children)

    def ancestors(self) -> Iterator[Element]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = self.node = Element("#document", {})

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs}, self.node)
        self.node.children.append(element)
        if tag not in VOID:
            self.node = element

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.node.children.append(Element(tag, {k: v or "" for k, v in attrs}, self.node))

    def handle_endtag(self, tag: str) -> None:
        open_ = next((n for n in [self.node, *self.node.ancestors()] if n.tag == tag), None)
        if open_ is not None and open_.parent is not None:  # a stray end tag closes nothing
            self.node = open_.parent

    def handle_data(self, data: str) -> None:
        if self.node.tag not in ("script", "style"):
            self.node.children.append(data)


def text_of(element: Element | None) -> str:
    return element.text() if element is not None else ""


def link_in(element: Element | None) -> Element | None:
    return element.find("a") if element is not None else None


def parse(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


# ---------------------------------------------------------------- the checks: a page's DOM -> a verdict


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str  # what the page shows, or what it lacks
    link: str | None = None  # the href the check followed from this page, for the next page to open


def loaded(img: Element) -> bool:
    """An <img> that finished loading with pixels (the browser's `naturalWidth`, copied by DUMP_JS)."""
    return (img.attrs.get("data-natural-width") or "0").isdigit() and int(img.attrs["data-natural-width"]) > 0


def chart_cards(page: Element) -> list[tuple[str, Element]]:
    """(title, card) of each chart card, in page order; a card titled by its heading (MLflow titles a chart by the
    key's last part: `reward/reward_mean` -> `reward_mean`)."""
    cards = page.find_all(data_testid="experiment-view-compare-runs-card")
    return [(heading.attrs.get("title", ""), c) for c in cards if (heading := c.find("h4")) is not None]


def chart_card(page: Element, metric: str) -> Element | None:
    """The chart card of metric key `metric`, titled with the key or its last part."""
    titles = {metric, metric.rpartition("/")[2]}
    return next((card for title, card in chart_cards(page) if title in titles), None)


def reward_chart(page: Element, metric: str, logged: int) -> Verdict:
    """The chart card of `metric` plots one marker per logged step (plotly's `path.point`s; its line drops
    points it can interpolate, so markers are counted, in the card's fullest trace)."""
    card = chart_card(page, metric)
    if card is None:
        return Verdict(False, f"no chart card titled {metric}")
    points = max((len(trace.find_all("path", cls="point")) for trace in card.find_all("g", cls="trace")), default=0)
    return Verdict(points == logged > 0, f"{metric} chart plots {points} points, {logged} steps logged")


def key_images(page: Element, run_id: str, key: str) -> list[Element]:
    """The <img>s of the grids logged under image key `key` by this run (MLflow's image card fetches
    `get-artifact?path=images/<key>+step+...&run_uuid=<run>`)."""

    def logged_by_run(img: Element) -> bool:
        query = parse_qs(urlparse(img.attrs.get("src", "")).query)
        return query.get("run_uuid") == [run_id] and query.get("path", [""])[0].startswith(f"images/{key}+step+")

    return [img for img in page.find_all("img") if logged_by_run(img)]


def sample_image(page: Element, run_id: str, key: str = "samples") -> Verdict:
    """An <img> shows the grid logged under image key `key` by this run and has loaded."""
    images = key_images(page, run_id, key)
    shown = sum(map(loaded, images))
    if not images:
        return Verdict(False, f"no image of key {key!r} from run {run_id[:8]}")
    return Verdict(shown > 0, f"{shown} of {len(images)} {key!r} images loaded")


def tree_path(node: Element) -> str:
    """The path of an artifact-tree node: the first node of each enclosing <li>, outermost first."""
    items = [a for a in node.ancestors() if a.tag == "li"]
    return "/".join(li.find(data_testid="artifact-tree-node").attrs.get("artifact-name", "") for li in reversed(items))


def artifact_list(page: Element, files: Sequence[str], previewed: str) -> Verdict:
    """The run's artifact tree lists every path of `files` (a file under a folder shown under that folder), and
    the preview of `previewed` (the page's selected file) is a loaded image."""
    listed = {tree_path(node) for node in page.find_all(data_testid="artifact-tree-node")}
    missing = [f for f in files if f not in listed]
    if missing:
        return Verdict(False, f"artifact tree lacks {', '.join(missing)} (lists {len(listed)} entries)")
    preview = [img for img in page.find_all("img", alt=previewed) if loaded(img)]
    return Verdict(bool(preview), f"lists {', '.join(files)}; preview of {previewed} " +
                   ("shown" if preview else "not loaded"))  # fmt: skip


def registered_model(page: Element, model: str, alias: str, description: str) -> Verdict:
    """The model version page: under `model` (breadcrumb), tagged `@ alias`, with `description` (its markdown
    rendered) and a signature (the schema's inputs and outputs)."""
    problems = []
    crumb = page.find("a", data_testid="breadcrumbRegisteredModel")
    if crumb is None or crumb.text() != model:
        problems.append(f"not a version of {model}")
    if not any(tag.text() == f"@ {alias}" for tag in page.find_all(role="status", title=alias)):
        problems.append(f"no alias @{alias}")
    shown = page.find(data_testid="note-editor-preview-content")
    if shown is None or shown.text() != " ".join(description.replace("`", "").split()):
        problems.append("no description" if shown is None or not shown.text() else "another description")
    schema = page.text()
    if not re.search(r"Inputs \(\d+\)", schema) or not re.search(r"Outputs \(\d+\)", schema):
        problems.append("no signature")
    return Verdict(not problems, "; ".join(problems) or f"{model} @{alias}, its description and signature")


def mlflow_prefect_link(page: Element, flow_run_url: str, flow_run_name: str) -> Verdict:
    """The MLflow run's description links its Prefect flow run (the `prefect.flow_run_url` tag, also shown)."""
    if not flow_run_url:
        return Verdict(False, "the run has no prefect.flow_run_url tag (Prefect knew no UI URL)")
    note = page.find(data_testid="note-editor-preview-content")
    links = [a for a in (note.find_all("a") if note else []) if a.attrs.get("href") == flow_run_url]
    tag = page.find("span", title=flow_run_url)
    if not links:
        return Verdict(False, f"the description has no link to {flow_run_url}")
    if links[0].text() != flow_run_name or tag is None:
        return Verdict(False, f"link text {links[0].text()!r}, tag shown: {tag is not None}")
    return Verdict(True, f"description links {flow_run_name}: {flow_run_url}", link=flow_run_url)


def prefect_flow_run(page: Element, name: str, flow: str, parent: str | None = None, log: str = "") -> Verdict:
    """The Prefect flow-run page of `name`: its heading (breadcrumb, Completed badge, flow, parent run) and, with
    `log`, a log line containing it."""
    header = page.find("header", cls="page-heading-flow-run")
    if header is None:
        return Verdict(False, "no flow-run heading")
    crumbs = header.find_all(cls="p-bread-crumbs__crumb")
    found = {
        "run": crumbs[-1].text() if crumbs else "",
        "state": text_of(header.find(cls="state-badge")),
        "flow": text_of(link_in(header.find(cls="flow-run-flow"))),
        "parent": text_of(link_in(header.find(cls="flow-run-parent-flow-run"))),
    }
    want = {"run": name, "state": "Completed", "flow": flow} | ({"parent": parent} if parent else {})
    wrong = [f"{k} {found[k]!r} (want {v!r})" for k, v in want.items() if found[k] != v]
    if log and not any(log in row.text() for row in page.find_all(cls="log-row__content")):
        wrong.append(f"no log line with {log!r}")
    return Verdict(not wrong, "; ".join(wrong) or f"flow run {name} of {flow}: Completed")


def pipeline_summary(page: Element, stages: Sequence[str], model: str, alias: str) -> Verdict:
    """The `pipeline-summary` artifact: its stage table (one row per stage) and the registered model line."""
    rows = [tr.find("td") for tr in page.find_all("tr")]
    shown = [cell.text() for cell in rows if cell is not None]
    if shown != list(stages):
        return Verdict(False, f"stage table rows {shown} (want {list(stages)})")
    line = re.compile(rf"registered model: {re.escape(model)} version \d+ \(alias {re.escape(alias)}\)")
    if not any(line.search(li.text()) for li in page.find_all("li")):
        return Verdict(False, f"no 'registered model: {model} ... (alias {alias})' line")
    return Verdict(True, f"stages {', '.join(stages)}; {model} (alias {alias})")


def prefect_mlflow_link(page: Element, run_url: str) -> Verdict:
    """The `train-summary` artifact links the MLflow run page."""
    links = [a for a in page.find_all("a") if a.attrs.get("href") == run_url]
    if not links:
        found = [a.attrs["href"] for a in page.find_all("a") if "/#/experiments/" in a.attrs.get("href", "")]
        return Verdict(False, f"no link to {run_url}" + (f" (links {', '.join(found)})" if found else ""))
    return Verdict(True, f"links {run_url}", link=run_url)


def mlflow_run(page: Element, run_id: str, run_name: str) -> Verdict:
    """The MLflow run page of `run_id`: its name in the header, its id in the overview."""
    header = page.find(data_testid="runs-header")
    shown_id = page.find(data_testid="key-value-Run ID")
    if header is None or header.text() != run_name:
        return Verdict(False, f"header {header.text() if header else None!r} (want {run_name!r})")
    if shown_id is None or run_id not in shown_id.text():
        return Verdict(False, f"run id {run_id} not shown")
    return Verdict(True, f"run {run_name} ({run_id})")


def charts_lead_with(page: Element, metric: str) -> Verdict:
    """The run's charts tab shows the chart of `metric` first (MLflow orders the charts by section and key)."""
    cards = chart_cards(page)
    if not cards:
        return Verdict(False, "no chart cards")
    first = cards[0][0]
    ok = first in (metric, metric.rpartition("/")[2])
    return Verdict(ok, f"the first of {len(cards)} charts is {first!r}" + ("" if ok else f" (want {metric!r})"))


def axis_reads_values(page: Element, metric: str) -> Verdict:
    """The y axis of `metric`'s chart prints distinct tick labels (not "0, 0, 0": a range of float noise)."""
    card = chart_card(page, metric)
    if card is None:
        return Verdict(False, f"no chart card titled {metric}")
    ticks = [tick.text() for tick in card.find_all("g", cls="ytick")]
    ok = len(ticks) >= 2 and len(set(ticks)) == len(ticks)
    return Verdict(ok, f"{metric} y axis reads {', '.join(ticks) or 'nothing'}")


def legible_image(page: Element, run_id: str, min_width: int, key: str = "samples") -> Verdict:
    """The loaded grid of image key `key` from this run is at least `min_width` pixels wide (its natural width:
    the captions drawn at a readable size)."""
    found = sample_image(page, run_id, key)
    if not found.ok:
        return found
    widest = max(int(img.attrs["data-natural-width"]) for img in key_images(page, run_id, key) if loaded(img))
    return Verdict(widest >= min_width, f"the {key!r} grid is {widest} px wide (want >= {min_width})")


def model_training_side(page: Element) -> Verdict:
    """MLflow shows the experiment on its machine-learning side: the sidebar lists "Runs", not the GenAI side's
    "Evaluation runs" and "Traces" overview."""
    nav = page.find_all("nav")
    labels = {e.text() for n in nav for e in n.iter() if e.tag in ("a", "span", "div", "li")}
    if "Evaluation runs" in labels:
        return Verdict(False, "the sidebar lists 'Evaluation runs' (the GenAI side)")
    if "Runs" not in labels:
        return Verdict(False, "the sidebar lists no 'Runs'")
    return Verdict(True, "the sidebar lists Runs (machine learning)")


def prefect_api_tag(page: Element, api_url: str) -> Verdict:
    """The MLflow run shows its `prefect.api_url` tag: the Prefect API its flow run ran against."""
    if not api_url:
        return Verdict(False, "the run has no prefect.api_url tag")
    shown = page.find("span", title=api_url) is not None or api_url in page.text()
    return Verdict(shown, f"prefect.api_url {api_url} " + ("shown" if shown else "not shown"))
