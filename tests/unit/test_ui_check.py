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


# ---------------------------------------------------------------- issue 36: what MLflow's UI makes of the runs

REWARD, LOSS = "reward/reward_mean", "train/loss"  # their MLflow keys (unirl_core/tracking/mlflow_ui.py)


def cards(*titles: str, ticks: tuple[str, ...] = ()) -> str:
    """Chart cards as MLflow 3.17 draws them (a heading titled by the key's last part, plotly's y ticks)."""
    tick_html = "".join(f'<g class="ytick"><text>{t}</text></g>' for t in ticks)
    return "".join(f'<div data-testid="experiment-view-compare-runs-card"><h4 title="{t}">{t}</h4>'
                   f'<svg><g class="yaxislayer-above">{tick_html}</g></svg></div>' for t in titles)  # fmt: skip


def test_the_charts_tab_must_lead_with_the_reward_chart():
    assert check(cards("reward_mean", "reward_std", "loss"), ui.charts_lead_with, REWARD).ok
    verdict = check(cards("advantage_abs_max", "advantage_mean", "reward_mean"), ui.charts_lead_with, REWARD)
    assert not verdict.ok and "'advantage_abs_max'" in verdict.detail  # the old alphabetical page
    assert not check(SPINNER, ui.charts_lead_with, REWARD).ok


def test_an_axis_must_print_distinct_values():
    assert check(cards("loss", ticks=("-1.000000", "0.000000", "1.000000")), ui.axis_reads_values, LOSS).ok
    verdict = check(cards("loss", ticks=("0", "0", "0")), ui.axis_reads_values, LOSS)
    assert not verdict.ok and "0, 0, 0" in verdict.detail  # float noise on the axis
    assert not check(cards("loss"), ui.axis_reads_values, LOSS).ok  # no axis drawn yet
    assert not check(cards("reward_mean", ticks=("1", "2")), ui.axis_reads_values, LOSS).ok


def test_the_enlarged_grid_must_be_wide_enough_to_read():
    dialog = ui.parse(page("mlflow_sample_image")).find(role="dialog")
    verdict = ui.legible_image(dialog, RUN_ID, 512)
    assert not verdict.ok and "256 px" in verdict.detail  # the page saved before: a 256 px grid
    wide = page("mlflow_sample_image").replace('data-natural-width="256"', 'data-natural-width="600"')
    assert ui.legible_image(ui.parse(wide).find(role="dialog"), RUN_ID, 512).ok
    unloaded = page("mlflow_sample_image").replace('data-natural-width="256"', 'data-natural-width="0"')
    assert not ui.legible_image(ui.parse(unloaded).find(role="dialog"), RUN_ID, 512).ok


def test_the_artifact_preview_must_be_wide_enough_to_read():
    assert not check(page("mlflow_artifacts"), ui.artifact_width, GRIDS[0]).ok  # 160 px, saved before
    wide = page("mlflow_artifacts").replace('data-natural-width="160"', 'data-natural-width="640"')
    assert check(wide, ui.artifact_width, GRIDS[0]).ok


GENAI_NAV = "<nav><ul><li><a>Overview</a></li><li><a>Traces</a></li><li><a>Evaluation runs</a></li></ul></nav>"
ML_NAV = "<nav><ul><li><a>Runs</a></li><li><a>Models</a></li><li><a>Traces</a></li></ul></nav>"


def test_the_experiment_must_open_on_the_model_training_side():
    assert check(ML_NAV, ui.model_training_side).ok
    assert "Evaluation runs" in check(GENAI_NAV, ui.model_training_side).detail
    assert not check(SPINNER, ui.model_training_side).ok


def test_the_run_must_show_the_prefect_api_it_ran_against():
    api = "http://127.0.0.1:4311/api"
    assert check(f'<span title="{api}">{api}</span>', ui.prefect_api_tag, api).ok
    assert not check(page("mlflow_run_overview"), ui.prefect_api_tag, api).ok  # saved before the tag existed
    assert not check(f'<span title="{api}">{api}</span>', ui.prefect_api_tag, "").ok


def test_every_link_opens_mlflow_on_its_machine_learning_side():
    demo = ui.Demo(prefect_url="http://p", mlflow_url="http://m", run_id=RUN_ID, experiment_id="1", reward_points=24,
                   artifacts=(*GRIDS, "recipe.yaml"), version="1", description="", flow_run_url=FLOW_RUN_URL,
                   flow_run_name="x", prefect_api_url="", pipeline_run=("a", "b"), pipeline_summary="s",
                   train_summary="t")  # fmt: skip
    urls = [p.url for p in ui.pages(demo) if p.url.startswith("http://m")]
    urls += [source.url for source, _ in ui.linked_pages(demo) if source.url.startswith("http://m")]
    assert len(urls) >= 6 and all(u.endswith("?workflowType=machine_learning") for u in urls), urls
    assert (
        demo.run_tab("model-metrics")
        == f"http://m/#/experiments/1/runs/{RUN_ID}/model-metrics?workflowType=machine_learning"
    )
