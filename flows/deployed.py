"""Deployment entry points: each takes a recipe (a file or a packaged name) and `--set`-style overrides, so a
Prefect deployment's parameters are two plain fields in the UI form, and runs one stage or the whole pipeline."""

from __future__ import annotations

from flows.engine import flow
from flows.ingest import ingest
from flows.pipeline import pipeline
from flows.precache import precache
from flows.train import train
from unirl_core.summaries import IngestSummary, PipelineSummary, PrecacheSummary, TrainSummary


def _load(recipe: str, overrides: list[str] | None, section: str | None = None):
    from unirl_core.config import load_recipe

    loaded = load_recipe(recipe, overrides or [])
    if section and getattr(loaded, section) is None:
        raise ValueError(f"recipe {recipe} has no `{section}` section")
    return loaded


@flow(name="ingest-recipe", log_prints=True)
def ingest_recipe(recipe: str = "ingest_parquet", overrides: list[str] | None = None) -> IngestSummary:
    """The ingest section of `recipe`."""
    return ingest(_load(recipe, overrides, "ingest").ingest)


@flow(name="precache-recipe", log_prints=True)
def precache_recipe(recipe: str = "pipeline_demo", overrides: list[str] | None = None) -> PrecacheSummary:
    """The precache section of `recipe`."""
    return precache(_load(recipe, overrides, "precache").precache)


@flow(name="train-recipe", log_prints=True)
def train_recipe(recipe: str = "demo", overrides: list[str] | None = None) -> TrainSummary:
    """The train section of `recipe` (warm-up and RL rounds)."""
    loaded = _load(recipe, overrides, "train")
    return train(loaded.train, run_name=loaded.name or "train", precache=loaded.precache)


@flow(name="pipeline-recipe", log_prints=True)
def pipeline_recipe(recipe: str = "pipeline_demo", overrides: list[str] | None = None) -> PipelineSummary:
    """Every section of `recipe` in order (ingest -> precache -> train)."""
    return pipeline(_load(recipe, overrides))
