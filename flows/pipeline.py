"""The pipeline flow: a recipe's sections in order, ingest -> precache -> train -> promote, each as its own subflow.

Every stage resumes from its committed outputs (ingest skips committed work units, precache committed shards,
training committed steps), so a re-run after any failure redoes only what is missing. A final markdown artifact
(`pipeline-summary`) holds the stage table and where the results are. In MLflow the pipeline is a parent run (each
stage's numbers, the stage table) whose child is the training run, linked to this flow run.
"""

from __future__ import annotations

import time

from prefect.artifacts import create_markdown_artifact

from flows.engine import flow
from flows.ingest import ingest
from flows.precache import precache
from flows.promote import model_name_of, promote
from flows.train import train
from tasks.train import prefect_tags
from unirl_core.config.schema import Recipe
from unirl_core.summaries import PipelineSummary
from unirl_core.tracking.pipeline_run import pipeline_run


@flow(name="pipeline", log_prints=True)
def pipeline(recipe: Recipe) -> PipelineSummary:
    """Run every section the recipe has, in order; returns each stage's summary."""
    stages = {}
    seconds: dict[str, float] = {}
    experiment = recipe.train.tracking.experiment if recipe.train else "unirl"
    with pipeline_run(experiment, recipe.name or "pipeline", recipe.model_dump_json(), prefect_tags()) as tracked:
        for name, section, run in (
            ("ingest", recipe.ingest, lambda: ingest(recipe.ingest)),
            ("precache", recipe.precache, lambda: precache(recipe.precache)),
            ("train", recipe.train,
             lambda: train(recipe.train, run_name=recipe.name or "train", precache=recipe.precache)),
            ("promote", recipe.promote, lambda: promote(recipe.promote, model_name_of(recipe), recipe.train)),
        ):  # fmt: skip
            if section is None:
                continue
            started = time.monotonic()
            stages[name] = run()
            seconds[name] = time.monotonic() - started
            tracked.log_stage(name, stages[name].model_dump(mode="json"), seconds[name])
        summary = PipelineSummary(**stages, seconds=seconds)
        markdown = report(summary)
        tracked.log_text(markdown, "pipeline_summary.md")
    create_markdown_artifact(markdown=markdown, key="pipeline-summary", description=f"pipeline {recipe.name}")
    return summary


def _encoded(samples: int, encoded: int) -> str:
    if encoded == samples:
        return f"{samples} samples encoded"
    return f"{samples} samples reused" if not encoded else f"{samples} samples ({encoded} encoded, the rest reused)"


def report(summary: PipelineSummary) -> str:
    """The stage table and where the results are (markdown; the `unirl run` command prints it too)."""
    ingest, precache, train, seconds = summary.ingest, summary.precache, summary.train, summary.seconds
    lines = ["| stage | result | seconds |", "|---|---|---|"]
    if ingest:
        reused = " (reused)" if ingest.units and not ingest.new_units else ""
        lines.append(f"| ingest | {ingest.ok} of {ingest.rows} rows ok{reused}, {ingest.skipped} skipped, "
                     f"{ingest.shards} shards | {seconds['ingest']:.1f} |")  # fmt: skip
    if precache:
        lines.append(f"| precache | {_encoded(precache.samples, precache.encoded)}, {precache.skipped} skipped | "
                     f"{seconds['precache']:.1f} |")  # fmt: skip
    if train:
        reused = " (reused)" if train.rounds and all(r.skipped for r in train.rounds) else ""
        lines.append(f"| train | {len(train.rounds)} {'round' if len(train.rounds) == 1 else 'rounds'}{reused}, "
                     f"model version {train.model_version} | {seconds['train']:.1f} |")  # fmt: skip
    if summary.promote:
        decided = summary.promote
        verdict = "champion" if decided.promoted else f"stays candidate (champion: version {decided.champion_before})"
        lines.append(f"| promote | version {decided.candidate} {verdict} | {seconds['promote']:.1f} |")
    lines.append("")
    if ingest:
        lines.append(f"- dataset: `{ingest.dataset}`")
    if precache:
        lines.append(f"- encodings: `{precache.output}`")
    if train:
        lines += [
            f"- last checkpoint: `{train.checkpoint}`",
            f"- registered model: `{train.registered_model}` version {train.model_version} (alias `{train.alias}`)",
            f"- MLflow run: {train.mlflow_run_url or train.mlflow_run_id}",
        ]
    if summary.promote:
        lines.append(f"- promotion: {summary.promote.reason}")
    return "\n".join(lines)
