"""What each stage returns: typed summaries, read across layers (flows, the `unirl` command, reports, tests).

    IngestSummary     the ingest flow            built by unirl_core.ingest.stages.summarize
    PrecacheSummary   the precache flow          built by unirl_core.precache.stages.summarize
    RoundSummary      one training round         trainer.run_round (validated at the task boundary)
    ExportSummary     the final export + model   trainer.finalize (validated at the task boundary)
    TrainSummary      the train flow             its rounds, the final export and `train.eval`'s EvalCurve
    PipelineSummary   the pipeline flow          each stage's summary and wall time

Frozen pydantic models that refuse undeclared keys (a renamed key is an error, not a silent None downstream) and
round-trip through JSON (`model_dump_json` / `model_validate_json`): Prefect can persist them with its JSON
serializer, nothing needs pickle.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from unirl_core.evaluation.promote import Promotion


class _Summary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IngestSummary(_Summary):
    dataset: str  # the dataset root (dataset_output_root)
    units: int  # work units planned (file x row range)
    rows: int  # input rows read, over every unit
    ok: int  # rows that became samples
    skipped: int  # rows skipped, over every reason
    skip_reasons: dict[str, int]  # reason -> rows, sorted by reason
    seconds: float  # wall time of the flow, from the first unit it committed when that started before it (head start)
    images_per_s: float | None  # ok / seconds (None for a zero duration)
    shards: int | None = None  # shards in the index; None without the generate_wdinfo stage
    samples_in_shards: int | None = None  # samples in complete shards (the index's total_key_count)
    incomplete_shards: list[str] | None = None  # names of shards short of tar_chunk_size (the tail)
    bytes: int | None = None  # size of the indexed shards
    new_units: int = 0  # units this run committed (the `dataset.updated` event also needs them, or a changed index)


class PrecacheSummary(_Summary):
    output: str  # the output folder (precache output_dir)
    tasks: int  # NeMo task slices run
    source_samples: int  # samples read from the source shards
    samples: int  # samples in the cache
    encoded: int = 0  # of those, encoded by this run (the rest were committed before and reused)
    skipped: int  # samples skipped (undecodable, missing modality, ...)
    shards: int  # encoding shards in the index
    samples_in_complete_shards: int  # the index's total_key_count
    seconds: float  # wall time of the flow
    samples_per_s: float | None  # samples / seconds (None for a zero duration)


class RoundSummary(_Summary):
    round: str  # "warmup round 0", "rl round 1", ...
    first_step: int  # first global step of the round (inclusive)
    end_step: int  # last global step + 1
    skipped: bool = False  # every step was committed already: nothing ran
    checkpoint: str | None = None  # the last checkpoint committed by the round (or found, when skipped)
    resumed_from: int | None = None  # global step of the checkpoint it resumed after (-1: started fresh)
    shard_elements: list[dict[str, int]] = Field(default_factory=list)  # per rank: local_elements, full_elements
    warmup_eval_loss_before: float | None = None  # warm-up: fixed-draw eval loss before the round's steps
    warmup_eval_loss: float | None = None  # warm-up: the same loss after them
    samples: str | None = None  # RL: PNG grid of the round's last step
    eval_samples: str | None = None  # RL: PNG grid of the evaluation prompts, when evaluated after this round
    metrics: dict[str, float] = Field(default_factory=dict)  # the round's last step, as logged
    mlflow_run_id: str | None = None  # the training's MLflow run (one run across rounds)
    seconds: float | None = None  # wall time of the round (None when skipped)


class EvalPoint(_Summary):
    """One evaluation during training (`train.eval`: unirl_core/controller/train_eval.py)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")  # the interval of one prompt is NaN, kept as NaN

    step: int  # global step whose weights (before it trains) were evaluated
    digest: str  # what the numbers depend on (sets, rewards, steps, guidance, seed): another is recomputed
    metrics: dict[str, dict[str, float]]  # `<set>/<reward>` -> mean, low, high, n
    train_reward: float | None = None  # mean reward_mean of the steps since the previous point (None at the first)
    first_train_reward: float | None = None  # reward_mean of the first RL step (None at the first point)
    seconds: float = 0.0


class EvalCurve(_Summary):
    """Every point of a run, the best one of `train.eval.best`, and the guards' breaches."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    points: list[EvalPoint]
    best_metric: str
    best_step: int | None = None
    best_value: float | None = None
    breaches: list[str] = []


class ExportSummary(_Summary):
    export: str  # folder of the exported adapter (LoRA) or merged pipeline
    checkpoint: str  # the committed checkpoint it was exported from
    registered_model: str  # MLflow registered model name
    model_version: str | None = Field(coerce_numbers_to_str=True)  # its new version ("3": MLflow's sqlite store
    # answers a number, a tracking server text); None when the tracking server was unreachable
    alias: str  # the alias set on that version (tracking.alias)
    mlflow_run_id: str | None
    mlflow_run_url: str | None  # the run page when tracking goes to a server (http); else None
    tracking_failures: int = 0  # tracking calls that failed and were skipped (training goes on without MLflow)


class TrainSummary(ExportSummary):
    """The final export and registration, plus every round."""

    rounds: list[RoundSummary]  # in order: warm-up rounds, then RL rounds
    final_metrics: dict[str, float] = Field(default_factory=dict)  # the last round's last step
    eval: EvalCurve | None = None  # `train.eval`'s points, best step and guard breaches (None without it)


class PipelineSummary(_Summary):
    ingest: IngestSummary | None = None  # None when the recipe has no such section
    precache: PrecacheSummary | None = None
    train: TrainSummary | None = None
    promote: Promotion | None = None
    seconds: dict[str, float] = Field(default_factory=dict)  # wall time per stage that ran
