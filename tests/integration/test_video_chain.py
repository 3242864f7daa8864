"""Video data through the whole chain with real Prefect, Ray (2 CPU workers), MLflow (sqlite) and the tiny Wan 2.1:
synthetic clips plus bad ones -> ingest (guarded, counted skips by reason) -> precache (Wan VAE latents of 9 frames
at 8 fps, umT5 conditioning) -> warm-up on the video latents -> RL; a re-run redoes nothing."""

from __future__ import annotations

import json
import math
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_video_pipeline_runs_every_stage_and_a_rerun_redoes_nothing(prefect_harness, tmp_path, monkeypatch):
    from flows.pipeline import pipeline, report
    from unirl_core.config import load_recipe
    from unirl_core.data.synthetic_video import synthetic_video_prompts, write_synthetic_video_parquet
    from unirl_core.precache.read import read_encodings

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("INPUT_PARQUET", write_synthetic_video_parquet(str(tmp_path / "clips.parquet"), rows=8))
    (tmp_path / "prompts.txt").write_text("\n".join(synthetic_video_prompts(8)))
    monkeypatch.setenv("DATA_PATH", str(tmp_path / "prompts.txt"))
    overrides = [f"ingest.dataset_output_root={tmp_path / 'data'}", f"train.output_dir={tmp_path / 'out'}",
                 "train.warmup.steps=2", "train.steps=2", "train.steps_per_round=2"]  # fmt: skip
    recipe = load_recipe("pipeline_video", overrides)
    first = pipeline(recipe)

    ingest, precache, train = first.ingest, first.precache, first.train
    # 8 good clips (2 webm, re-encoded to mp4) + a 4-frame clip ingest keeps; 3 bad rows skipped by reason
    assert (ingest.rows, ingest.ok) == (12, 9)
    assert ingest.skip_reasons == {"not_a_video": 1, "too_long": 1, "truncated": 1}
    with tarfile.open(tmp_path / "data" / "shards" / "00000.tar") as shard:
        names = shard.getnames()
        meta = json.loads(shard.extractfile(names[0]).read())
    assert {n.rsplit(".", 1)[1] for n in names} == {"mp4", "txt", "json"}
    assert (meta["num_frames"], meta["fps"], meta["width"], meta["height"]) == (16, 12.0, 32, 32)
    assert meta["duration"] == pytest.approx(16 / 12, abs=1e-5)

    # the 4-frame clip is too short for 9 frames at 8 fps: a counted precache skip; the rest are Wan latents
    assert (precache.samples, precache.skipped, precache.encoded) == (8, 1, 8)
    index = json.loads((tmp_path / "data" / "precache" / "index.json").read_text())
    assert index["skipped_in_reorganize"] == {"too_short": 1}
    shapes = {
        tuple(s["encodings"]["video_latent"].shape) for s in read_encodings(recipe.precache.output_dir, recipe.precache)
    }
    assert shapes == {(16, 3, 4, 4)}  # [C, (9 - 1) / 4 + 1, 32 / 8, 32 / 8]

    assert [r.round for r in train.rounds] == ["warmup round 0", "rl round 0"]
    warmup = train.rounds[0]  # the denoising loss on the video latents, on both ranks (split_batch over [B,C,F,h,w])
    assert [len(r) for r in (warmup.shard_elements, train.rounds[1].shard_elements)] == [2, 2]
    assert math.isfinite(warmup.warmup_eval_loss_before) and math.isfinite(warmup.warmup_eval_loss)
    assert math.isfinite(train.rounds[1].metrics["reward_mean"])
    assert train.alias == "candidate"

    again = pipeline(recipe)
    assert again.ingest.new_units == 0 and again.ingest.ok == 9
    assert (again.precache.samples, again.precache.encoded) == (8, 0)
    assert all(r.skipped for r in again.train.rounds) and again.train.model_version == train.model_version
    table = report(again).splitlines()
    assert "9 of 12 rows ok (reused)" in table[2] and "8 samples reused, 1 skipped" in table[3]
    assert "2 rounds (reused)" in table[4]
    assert Path(train.checkpoint).exists()
