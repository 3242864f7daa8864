"""The page checks of `make ui-check` (tools/ui_pages.py, driven by tools/ui_check.py) on trimmed real pages of
the demo (tests/unit/data/ui_check, saved from MLflow 3.17 and Prefect 3.8 in headless Chromium) and on broken ones:
each check passes on its page and fails on a spinner, on icons without data, on an image that did not load, on a
missing alias, on a wrong or missing link."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "ui_check"


def _load_ui_check():
    spec = importlib.util.spec_from_file_location("ui_check", ROOT / "tools" / "ui_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ui_check"] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


ui = _load_ui_check()

# What the APIs said the demo logged when the pages were saved.
RUN_ID = "4cd6c788bc604b8196a7b638a57f595b"
RUN_URL = f"http://127.0.0.1:5311/#/experiments/1/runs/{RUN_ID}"
FLOW_RUN_URL = "http://127.0.0.1:4311/flow-runs/flow-run/7adc5bbf-79f4-407f-bf3b-e4bf3e7e12dd"
GRIDS = tuple(f"samples/round_00{i}_step_000000{s}.png" for i, s in enumerate((15, 23, 31)))
DESCRIPTION = (
    "pipeline_demo: LoRA adapter for `tiny:sd3` (sd3), grpo, 8 warm-up + 24 RL steps; final reward_mean -1.327; "
    f"data prompts `534d1d450819`, precache `414d360719e6`. MLflow run `{RUN_ID}`."
)

# A page still loading: the app's frame (icons, tab labels, the run's name) and a spinner, no data. The old
# ui-check passed this ("Model metrics" in the page, an <svg> in it).
SPINNER = """<nav><a><svg class="icon"><path></path></svg>Experiments</a></nav><h2>pipeline_demo</h2>
<div role="tablist"><div>Overview</div><div>Model metrics</div><div>Artifacts</div></div>
<div class="du-bois-light-spin du-bois-light-spin-spinning"><svg class="icon"><path></path></svg></div>"""


def page(name: str) -> str:
    return (DATA / f"{name}.html").read_text()


def check(html: str, function, *args):
    return function(ui.parse(html), *args)


# ---------------------------------------------------------------- the reward chart


def test_reward_chart_counts_a_plotted_point_per_logged_step():
    verdict = check(page("mlflow_run_charts"), ui.reward_chart, "reward_mean", 24)
    assert verdict.ok, verdict.detail
    assert "24 points" in verdict.detail


def test_reward_chart_fails_on_a_spinner():
    assert not check(SPINNER, ui.reward_chart, "reward_mean", 24).ok


def test_reward_chart_fails_on_icons_and_an_empty_plot():
    empty = page("mlflow_run_charts").replace('<path class="point"></path>', "")
    assert "<svg" in empty  # icons and plotly's frame are still there
    verdict = check(empty, ui.reward_chart, "reward_mean", 24)
    assert not verdict.ok and "0 points" in verdict.detail


def test_reward_chart_fails_when_points_are_missing_or_the_chart_is_another_metric():
    assert not check(page("mlflow_run_charts"), ui.reward_chart, "reward_mean", 30).ok
    other = page("mlflow_run_charts").replace('title="reward_mean"', 'title="loss"')
    assert "no chart card" in check(other, ui.reward_chart, "reward_mean", 24).detail


# ---------------------------------------------------------------- the image card


def test_sample_image_is_the_runs_logged_grid_and_loaded():
    assert check(page("mlflow_run_charts"), ui.sample_image, RUN_ID).ok
    dialog = ui.parse(page("mlflow_sample_image")).find(role="dialog")
    assert ui.sample_image(dialog, RUN_ID).ok


def test_sample_image_fails_when_the_image_did_not_load():
    broken = re.sub(r'data-natural-width="\d+"', 'data-natural-width="0"', page("mlflow_run_charts"))
    verdict = check(broken, ui.sample_image, RUN_ID)
    assert not verdict.ok and "0 of 1" in verdict.detail


def test_sample_image_fails_on_a_spinner_another_run_or_another_key():
    assert not check(SPINNER, ui.sample_image, RUN_ID).ok
    assert not check(page("mlflow_run_charts"), ui.sample_image, "f" * 32).ok
    assert not check(page("mlflow_run_charts"), ui.sample_image, RUN_ID, "eval").ok  # not in the filtered cards


# ---------------------------------------------------------------- the artifacts


def test_artifact_list_shows_the_grids_under_samples_and_the_recipe():
    verdict = check(page("mlflow_artifacts"), ui.artifact_list, (*GRIDS, "recipe.yaml"), GRIDS[0])
    assert verdict.ok, verdict.detail


def test_artifact_list_fails_without_the_recipe_or_with_a_grid_outside_its_folder():
    no_recipe = page("mlflow_artifacts").replace('artifact-name="recipe.yaml"', 'artifact-name="notes.txt"')
    assert "lacks recipe.yaml" in check(no_recipe, ui.artifact_list, (*GRIDS, "recipe.yaml"), GRIDS[0]).detail
    assert not check(page("mlflow_artifacts"), ui.artifact_list, ("round_000_step_00000015.png",), GRIDS[0]).ok


def test_artifact_list_fails_when_the_preview_did_not_load():
    broken = re.sub(r'data-natural-width="\d+"', 'data-natural-width="0"', page("mlflow_artifacts"))
    assert not check(broken, ui.artifact_list, (*GRIDS, "recipe.yaml"), GRIDS[0]).ok


# ---------------------------------------------------------------- the registered model


def test_registered_model_shows_alias_description_and_signature():
    verdict = check(page("mlflow_model_version"), ui.registered_model, "unirl-pipeline_demo", "candidate", DESCRIPTION)
    assert verdict.ok, verdict.detail


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ('title="candidate"', 'title="champion"', "no alias @candidate"),
        ("final reward_mean -1.327", "final reward_mean -9.9", "another description"),
        ("Outputs (1)", "", "no signature"),
        (">unirl-pipeline_demo<", ">unirl-other<", "not a version of"),
    ],
)
def test_registered_model_fails_without_what_it_names(old, new, problem):
    broken = page("mlflow_model_version").replace(old, new)
    verdict = check(broken, ui.registered_model, "unirl-pipeline_demo", "candidate", DESCRIPTION)
    assert not verdict.ok and problem in verdict.detail


def test_registered_model_fails_on_a_spinner():
    assert not check(SPINNER, ui.registered_model, "unirl-pipeline_demo", "candidate", DESCRIPTION).ok


# ---------------------------------------------------------------- the links between the UIs


def test_mlflow_run_links_its_prefect_flow_run():
    verdict = check(page("mlflow_run_overview"), ui.mlflow_prefect_link, FLOW_RUN_URL, "golden-cobra")
    assert verdict.ok, verdict.detail
    assert verdict.link == FLOW_RUN_URL


def test_mlflow_prefect_link_fails_when_missing_or_wrong():
    overview = page("mlflow_run_overview")
    no_link = re.sub(r"<p>Prefect flow run: .*?</p>", "", overview)
    wrong = overview.replace(f'href="{FLOW_RUN_URL}"', 'href="http://127.0.0.1:4311/flow-runs/flow-run/other"')
    for broken in (no_link, wrong, SPINNER):
        verdict = check(broken, ui.mlflow_prefect_link, FLOW_RUN_URL, "golden-cobra")
        assert not verdict.ok and verdict.link is None
    assert not check(overview, ui.mlflow_prefect_link, "", "").ok  # the run has no link tag at all


def test_prefect_flow_run_page_of_the_linked_train_run():
    verdict = check(page("prefect_flow_run"), ui.prefect_flow_run, "golden-cobra", "train", "defiant-lorikeet",
                    "(rl round 0): reward")  # fmt: skip
    assert verdict.ok, verdict.detail
    assert check(page("prefect_pipeline_run"), ui.prefect_flow_run, "defiant-lorikeet", "pipeline").ok


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ("<span>golden-cobra</span>", "<span>other-run</span>", "run 'other-run'"),
        ("Completed</span>", "Running</span>", "state 'Running'"),
        ("<div>defiant-lorikeet</div>", "<div>other-parent</div>", "parent 'other-parent'"),
        ("step 8 (rl round 0)", "step 8", "no log line"),
    ],
)
def test_prefect_flow_run_fails_on_another_run_state_parent_or_log(old, new, problem):
    broken = page("prefect_flow_run").replace(old, new)
    verdict = check(broken, ui.prefect_flow_run, "golden-cobra", "train", "defiant-lorikeet", "(rl round 0): reward")
    assert not verdict.ok and problem in verdict.detail


def test_prefect_flow_run_fails_on_a_spinner():
    assert "no flow-run heading" in check(SPINNER, ui.prefect_flow_run, "golden-cobra", "train").detail


def test_train_summary_links_the_mlflow_run_which_opens_its_page():
    verdict = check(page("prefect_train_summary"), ui.prefect_mlflow_link, RUN_URL)
    assert verdict.ok and verdict.link == RUN_URL
    assert check(page("mlflow_run_overview"), ui.mlflow_run, RUN_ID, "pipeline_demo").ok


def test_train_summary_link_fails_when_it_is_text_or_another_run():
    as_text = re.sub(r"<a [^>]*>(.*?)</a>", r"<code>\1</code>", page("prefect_train_summary"))
    assert not check(as_text, ui.prefect_mlflow_link, RUN_URL).ok
    other = RUN_URL.replace(RUN_ID, "f" * 32)
    assert "no link to" in check(page("prefect_train_summary"), ui.prefect_mlflow_link, other).detail


def test_mlflow_run_page_fails_for_another_run_or_a_spinner():
    assert not check(page("mlflow_run_overview"), ui.mlflow_run, "f" * 32, "pipeline_demo").ok
    assert not check(SPINNER.replace("<h2>pipeline_demo</h2>", ""), ui.mlflow_run, RUN_ID, "pipeline_demo").ok


# ---------------------------------------------------------------- the pipeline summary


def test_pipeline_summary_has_the_stage_table_and_the_model():
    verdict = check(page("prefect_pipeline_summary"), ui.pipeline_summary, ("ingest", "precache", "train"),
                    "unirl-pipeline_demo", "candidate")  # fmt: skip
    assert verdict.ok, verdict.detail


def test_pipeline_summary_fails_without_a_stage_or_the_alias():
    stages, summary = ("ingest", "precache", "train"), page("prefect_pipeline_summary")
    no_train = re.sub(r"<tr><td>train</td>.*?</tr>", "", summary)
    assert "stage table rows" in check(no_train, ui.pipeline_summary, stages, "unirl-pipeline_demo", "candidate").detail
    assert not check(summary, ui.pipeline_summary, stages, "unirl-pipeline_demo", "champion").ok
    assert not check(SPINNER, ui.pipeline_summary, stages, "unirl-pipeline_demo", "candidate").ok


# ---------------------------------------------------------------- polling, the parser, --break


class FakeBrowser:
    """Answers with each of `doms` in turn (the last one from then on), as a page that finishes loading."""

    def __init__(self, doms: list[str]):
        self.doms, self.opened, self.shots = list(doms), [], []

    def open(self, url):
        self.opened.append(url)

    def evaluate(self, script):
        return self.doms.pop(0) if len(self.doms) > 1 else self.doms[0]

    def screenshot(self, path):
        self.shots.append(path)


def chart_page():
    return ui.Page("mlflow-run-charts", "http://mlflow/#/run", "http://mlflow/#/none",
                   (("chart", lambda p: ui.reward_chart(p, "reward_mean", 24)),))  # fmt: skip


def test_look_waits_past_the_spinner_for_the_data(monkeypatch, tmp_path):
    monkeypatch.setattr(ui.time, "sleep", lambda seconds: None)
    browser = FakeBrowser([SPINNER, SPINNER, page("mlflow_run_charts")])
    [(label, verdict)] = ui.look(browser, chart_page(), "http://mlflow/#/run", tmp_path, timeout=60)
    assert verdict.ok and browser.doms == [page("mlflow_run_charts")]
    assert browser.shots == [tmp_path / "mlflow-run-charts.png"]


def test_look_fails_when_only_a_spinner_shows_until_the_timeout(monkeypatch, tmp_path):
    monkeypatch.setattr(ui.time, "sleep", lambda seconds: None)
    browser = FakeBrowser([SPINNER])
    [(label, verdict)] = ui.look(browser, chart_page(), "http://mlflow/#/run", tmp_path, timeout=0)
    assert not verdict.ok and browser.shots  # screenshotted all the same, to see what showed


def test_parser_closes_void_and_stray_tags_and_collapses_text():
    root = ui.parse('<div class="a b"><img src="x"><p>one&nbsp; <b>two</b></p></span><p> three</p></div>')
    div = root.find("div", cls="b")
    assert [e.tag for e in div.children] == ["img", "p", "p"]
    assert div.text() == "one two three"
    assert root.find("div", cls="c") is None


def test_break_names_the_pages_that_open_first_and_points_each_elsewhere():
    demo = ui.Demo("http://p", "http://m", RUN_ID, "1", 24, (*GRIDS, "recipe.yaml"), "1", DESCRIPTION, FLOW_RUN_URL,
                   "golden-cobra", ("968acc05-780b-4f5d-9c1e-5b23ed73ec7b", "defiant-lorikeet"),
                   "ad1963af-3ac7-4ae5-804a-bd0d23b4c918", "04c241d6-e4c6-4681-8d0d-a6b4d02b376d")  # fmt: skip
    first = [*ui.pages(demo), *(source for source, _ in ui.linked_pages(demo))]
    assert [p.name for p in first] == list(ui.BREAKABLE)
    assert all(p.broken_url and p.broken_url != p.url for p in first)
