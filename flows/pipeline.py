"""The pipeline flow: a recipe's sections in order, ingest -> precache -> train, each as its own subflow.

Every stage resumes from its committed outputs (ingest skips committed work units, precache committed shards,
training committed steps), so a re-run after any failure redoes only what is missing. A final markdown artifact
(`pipeline-summary`) holds the stage table and where the results are.
"""

from __future__ import annotations

import time

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.ingest import ingest
from flows.precache import precache
from flows.train import train
from unirl_core.config.schema import Recipe


@flow(name="pipeline", log_prints=True)
def pipeline(recipe: Recipe) -> dict:
    """Run every section the recipe has, in order; returns each stage's summary."""
    stages: dict[str, dict] = {}
    seconds: dict[str, float] = {}
    for name, section, run in (
        ("ingest", recipe.ingest, lambda: ingest(recipe.ingest)),
        ("precache", recipe.precache, lambda: precache(recipe.precache)),
        ("train", recipe.train, lambda: train(recipe.train, run_name=recipe.name or "train", precache=recipe.precache)),
    ):
        if section is None:
            continue
        started = time.monotonic()
        stages[name] = run()
        seconds[name] = time.monotonic() - started
    create_markdown_artifact(markdown=report(stages, seconds), key="pipeline-summary",
                             description=f"pipeline {recipe.name}")  # fmt: skip
    return {"stages": stages, "seconds": seconds}


def report(stages: dict[str, dict], seconds: dict[str, float]) -> str:
    lines = ["| stage | result | seconds |", "|---|---|---|"]
    if "ingest" in stages:
        s = stages["ingest"]
        lines.append(f"| ingest | {s['ok']} of {s['rows']} rows ok, {s['skipped']} skipped, {s['shards']} shards "
                     f"| {seconds['ingest']:.1f} |")  # fmt: skip
    if "precache" in stages:
        s = stages["precache"]
        lines.append(
            f"| precache | {s['samples']} samples encoded, {s['skipped']} skipped | {seconds['precache']:.1f} |"
        )
    if "train" in stages:
        s = stages["train"]
        lines.append(
            f"| train | {len(s['rounds'])} rounds, model version {s['model_version']} | {seconds['train']:.1f} |"
        )
    lines.append("")
    if "ingest" in stages:
        lines.append(f"- dataset: `{stages['ingest']['dataset']}`")
    if "precache" in stages:
        lines.append(f"- encodings: `{stages['precache']['output']}`")
    if "train" in stages:
        s = stages["train"]
        lines += [
            f"- last checkpoint: `{s['checkpoint']}`",
            f"- registered model: `{s['registered_model']}` version {s['model_version']} (alias `{s['alias']}`)",
            f"- MLflow run: {s['mlflow_run_url'] or s['mlflow_run_id']}",
        ]
    return "\n".join(lines)
