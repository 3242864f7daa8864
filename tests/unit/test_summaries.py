"""The typed stage summaries: what the flows return and the command prints."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from unirl_core.summaries import (
    ExportSummary,
    IngestSummary,
    PipelineSummary,
    PrecacheSummary,
    RoundSummary,
    TrainSummary,
)

# What trainer.run_round and trainer.finalize return today (dicts), as the train tasks receive them.
RL_ROUND = {
    "round": "rl round 0", "first_step": 3, "end_step": 5, "resumed_from": 2,
    "shard_elements": [{"local_elements": 10, "full_elements": 20}, {"local_elements": 10, "full_elements": 20}],
    "checkpoint": "/out/checkpoints/step_00000004", "samples": "/out/samples/round_000_step_00000004.png",
    "metrics": {"reward_mean": 0.25, "approx_kl": 1e-4}, "mlflow_run_id": "abc", "seconds": 12.5,
}  # fmt: skip
SKIPPED_ROUND = {"round": "warmup round 0", "first_step": 0, "end_step": 3, "skipped": True,
                 "checkpoint": "/out/checkpoints/step_00000004", "resumed_from": 4}  # fmt: skip
FINAL = {
    "export": "/out/export/step_00000004", "checkpoint": "/out/checkpoints/step_00000004",
    "registered_model": "unirl-demo", "model_version": "3", "alias": "candidate", "mlflow_run_id": "abc",
    "mlflow_run_url": None, "tracking_failures": 0,
}  # fmt: skip


def test_round_and_export_dicts_validate_into_typed_summaries_that_round_trip_through_json():
    rounds = [RoundSummary.model_validate(SKIPPED_ROUND), RoundSummary.model_validate(RL_ROUND)]
    assert rounds[0].skipped and rounds[0].seconds is None and rounds[0].metrics == {}
    assert not rounds[1].skipped and rounds[1].shard_elements[0]["local_elements"] == 10
    assert RoundSummary.model_validate(rounds[1]) is rounds[1]  # a core that returns the model passes through
    final = ExportSummary.model_validate(FINAL | {"model_version": 3})  # MLflow's sqlite store answers a number
    assert final.model_version == "3"
    train = TrainSummary(rounds=rounds, final_metrics=rounds[-1].metrics, **final.model_dump())
    assert train.export == FINAL["export"] and train.rounds[1].metrics["reward_mean"] == 0.25
    assert TrainSummary.model_validate_json(train.model_dump_json()) == train
    pipeline = PipelineSummary(train=train, seconds={"train": 30.0})
    assert pipeline.ingest is None and PipelineSummary.model_validate_json(pipeline.model_dump_json()) == pipeline


def test_a_key_nobody_declared_is_an_error_not_a_silent_pass_through():
    with pytest.raises(ValidationError, match="reward_mean_typo"):
        RoundSummary.model_validate(RL_ROUND | {"reward_mean_typo": 1.0})
    with pytest.raises(ValidationError, match="registered_model"):
        ExportSummary.model_validate({k: v for k, v in FINAL.items() if k != "registered_model"})


def test_stage_summaries_are_built_by_the_core():
    from unirl_core.config.precache import PrecacheConfig
    from unirl_core.ingest.plan import WorkUnit
    from unirl_core.ingest.stages import summarize as summarize_ingest
    from unirl_core.precache.stages import summarize as summarize_precache

    units = [WorkUnit(0, "a.parquet", 0, 10), WorkUnit(1, "a.parquet", 10, 20)]
    stats = [
        {"count": 10, "successes": 9, "skip_reasons": {"no_image": 1}},
        {"count": 10, "successes": 8, "skip_reasons": {"decode_error": 1, "no_image": 1}},
    ]
    index = {"shardlist": [{"filesize": 100}, {"filesize": 50}], "total_key_count": 16, "incomplete": ["00001.tar"]}
    ingest = summarize_ingest("/data/ds", units, stats, index, seconds=2.0, new_units=1)
    assert isinstance(ingest, IngestSummary)
    assert (ingest.rows, ingest.ok, ingest.skipped, ingest.shards, ingest.bytes) == (20, 17, 3, 2, 150)
    assert ingest.skip_reasons == {"decode_error": 1, "no_image": 2} and ingest.images_per_s == 8.5
    assert summarize_ingest("/data/ds", units, stats, None, seconds=2.0).shards is None  # no index stage
    assert IngestSummary.model_validate_json(ingest.model_dump_json()) == ingest

    config = PrecacheConfig.model_validate({"input_dir": "/data/ds/shards", "output_dir": "/data/enc"})
    done = [{"samples": 4, "source_samples": 5, "skipped": [{"key": "x"}]}, {"samples": 5, "source_samples": 5,
            "skipped": []}]  # fmt: skip
    precache = summarize_precache(config, done, {"shardlist": [{}, {}], "total_key_count": 8}, seconds=3.0)
    assert isinstance(precache, PrecacheSummary)
    assert (precache.output, precache.samples, precache.skipped, precache.samples_per_s) == ("/data/enc", 9, 1, 3.0)


def test_the_pipeline_report_and_the_ingest_table_read_the_typed_summaries(capsys):
    from flows.cli import _print_summary
    from flows.pipeline import report

    ingest = IngestSummary(dataset="/data/ds", units=1, rows=10, ok=9, skipped=1, skip_reasons={"no_image": 1},
                           seconds=1.0, images_per_s=9.0, shards=2, samples_in_shards=8, new_units=1)  # fmt: skip
    final = ExportSummary.model_validate(FINAL)
    train = TrainSummary(rounds=[RoundSummary.model_validate(RL_ROUND)], **final.model_dump())
    text = report(PipelineSummary(ingest=ingest, train=train, seconds={"ingest": 1.0, "train": 2.0}))
    assert "| ingest | 9 of 10 rows ok, 1 skipped, 2 shards | 1.0 |" in text
    assert "| train | 1 round, model version 3 | 2.0 |" in text and "precache" not in text  # one round, run now
    assert "- registered model: `unirl-demo` version 3 (alias `candidate`)" in text and "promot" not in text
    from unirl_core.evaluation.promote import Promotion

    refused = Promotion(model_name="unirl-demo", candidate="3", champion_before="2", promoted=False,
                        reason="not ahead of champion version 2 on pickscore")  # fmt: skip
    text = report(PipelineSummary(train=train, promote=refused, seconds={"train": 2.0, "promote": 4.0}))
    assert "| promote | version 3 stays candidate (champion: version 2) | 4.0 |" in text
    assert "- promotion: not ahead of champion version 2 on pickscore" in text
    _print_summary(ingest)
    printed = capsys.readouterr().out
    assert "skipped: no_image" in printed and "samples_in_shards" in printed and "new_units" in printed
    assert "incomplete_shards" not in printed and "None" not in printed  # what did not run is left out
