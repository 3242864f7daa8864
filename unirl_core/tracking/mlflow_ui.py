"""What MLflow 3.17's UI does with what we log, and the names and values chosen for it (no mlflow import).

- The experiment kind: the tag `mlflow.experimentKind` (`custom_model_development`: "Machine learning") on every
  experiment we create or reuse. The UI itself follows its sidebar's GenAI / machine-learning switch, which is the
  page URL's `workflowType` search param, else the browser's last choice, else GenAI (Traces, "Evaluation runs"):
  every MLflow link we print or store carries `?workflowType=machine_learning` (`page_url`), and the UI keeps it
  across its own links.
- The charts of a run's "Model metrics" tab: one per metric, in sections named by the key's prefix before its last
  `/`, sections in alphabetical order and the unprefixed ones last, charts sorted by key within a section. A
  training metric is logged as `<section>/<name>` (`metric_key`) so that section "reward" (`reward_mean`,
  `reward_std`) leads, followed by the scored evaluation (`reward/eval/<set>/<reward>`) and each reward term;
  metrics.jsonl, the summaries and the Prefect logs keep the plain names.
- The y axis prints fixed-point with 6 decimals (plotly `tickformat: "f"`): float noise such as an advantage mean
  of 1e-17 or a loss of 1e-8 would read "0.000000" on every tick of a range spanning only noise, so a value of the
  metrics that are zero by construction up to float noise (NOISE_ZERO: group-normalized advantages' mean, the
  policy loss at ratio 1) below half the axis' last digit is logged as 0 (`axis_value`; metrics.jsonl keeps it
  exactly); every other metric (a learning rate of 1e-7) is logged as it is.
- The image card scales a grid to the card's width (about 300 px) and captions it with every param of the run
  ("Show run parameters"): a grid is stored at least `MIN_GRID_WIDTH` pixels wide (`legible_grid`), so the
  enlarged card and the artifact view show it, captions readable, at that size.
"""

from __future__ import annotations

import re

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"  # the UI's "Machine learning" kind
# kinds the UI reads as machine learning (a user's choice among them is kept)
MODEL_KINDS = {MODEL_TRAINING_KIND, "finetuning", "regression", "classification", "forecasting", "automl"}
WORKFLOW_QUERY = "workflowType=machine_learning"

# (pattern of a training metric's name, its chart section); the first match wins, the rest go to "train"
SECTIONS = (
    (re.compile(r"reward_(mean|std)"), "reward"),
    (re.compile(r"eval/(.+)"), "reward/eval"),  # scored evaluation during RL: eval/<set>/<reward>
    (re.compile(r"reward_.+"), "reward/terms"),  # each reward's share: reward_<name>_mean, _std
    (re.compile(r"(response_length|truncated|zero_std|images_per_s).*"), "rollout"),
    (re.compile(r"seconds_.+"), "time"),
    (re.compile(r"warmup_.+"), "warmup"),
    (re.compile(r"system/.+"), ""),  # MLflow's own system metrics: their own tab, as they are
)
AXIS_DIGITS = 6  # the decimals MLflow's y axis prints
NOISE_ZERO = frozenset({"advantage_mean", "loss"})  # zero by construction, up to float noise
MIN_GRID_WIDTH = 512  # pixels: the narrowest grid the run's image card and artifact view get


def metric_key(name: str) -> str:
    """The MLflow key of training metric `name`: `reward_mean` -> `reward/reward_mean`, `eval/a/clip` ->
    `reward/eval/a/clip`, `loss` -> `train/loss`; a `system/` metric as it is."""
    for pattern, section in SECTIONS:
        if match := pattern.fullmatch(name):
            if not section:
                return name
            return f"{section}/{match.group(1)}" if section == "reward/eval" else f"{section}/{name}"
    return f"train/{name}"


def axis_value(name: str, value: float) -> float:
    """`value` of metric `name` as the chart's axis can print it: a NOISE_ZERO metric's 0 when it rounds to 0 at
    the axis' 6 decimals (float noise); any other as it is."""
    return 0.0 if name in NOISE_ZERO and abs(value) < 0.5 * 10**-AXIS_DIGITS else value


def page_url(base: str, route: str) -> str:
    """The MLflow page `route` (`experiments/1/runs/<id>`, `models/<name>/versions/3`) of the UI at `base`, on the
    UI's machine-learning side."""
    return f"{base.rstrip('/')}/#/{route.strip('/')}?{WORKFLOW_QUERY}"


def legible_grid(image):
    """A PIL image at least MIN_GRID_WIDTH pixels wide: a narrower one scaled up by a whole factor (each pixel a
    square block: no blur, captions stay crisp); a wide enough one as it is."""
    if image.width >= MIN_GRID_WIDTH:
        return image
    factor = -(-MIN_GRID_WIDTH // image.width)  # ceil
    from PIL import Image

    return image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST)
