"""The whole chain (ingest -> precache with the family's own VAE latents and conditioning -> warm-up -> RL rounds on
Ray) on one family of each distinct path (family_cases.CHAIN_FAMILIES), with `unirl demo --family`'s overrides.
Their golden steps and resume tests are tests/integration/test_families.py."""

from __future__ import annotations

import pytest
from family_cases import CHAIN_FAMILIES, FAMILIES

from unirl_core.config import load_recipe

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("family", CHAIN_FAMILIES)
def test_the_whole_chain_runs_on_the_family(family, prefect_harness, ray_local, tmp_path, monkeypatch):
    from flows.cli import demo_family_overrides, demo_prompts
    from flows.pipeline import pipeline
    from unirl_core.data.synthetic import write_synthetic_parquet
    from unirl_core.models.registry import family_class

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")  # each family's own registry
    monkeypatch.setenv("INPUT_PARQUET", write_synthetic_parquet(str(tmp_path / "synthetic.parquet"), rows=8))
    monkeypatch.setenv("DATA_PATH", demo_prompts(family, tmp_path, 8))
    warmup = family_class(family).text_only_conditioning  # else: prompts encode with their images, no warm-up
    overrides = [f"ingest.dataset_output_root={tmp_path / 'data'}", f"train.output_dir={tmp_path / 'out'}",
                 "train.warmup.steps=2", "train.warmup.batch_size=4", "train.steps=2", "train.steps_per_round=2",
                 "train.eval_every_rounds=0", *demo_family_overrides(family), *FAMILIES[family]]  # fmt: skip
    summary = pipeline(load_recipe("pipeline_demo", overrides))
    assert summary.ingest.ok == 8 and summary.precache.samples == 8
    assert [r.round for r in summary.train.rounds] == ["warmup round 0"] * warmup + ["rl round 0"]
    assert summary.train.alias == "candidate"
