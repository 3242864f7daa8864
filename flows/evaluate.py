"""The evaluation flow (`unirl eval`): the spec checked against its folder -> one task per missing (model, shard),
each generating and scoring its prompts -> the table (results.parquet, summary.json), a Prefect table artifact and
an MLflow run.
"""

from __future__ import annotations

import time

from prefect.artifacts import create_progress_artifact, create_table_artifact, update_progress_artifact
from prefect.futures import as_completed

from flows.engine import flow
from tasks import evaluate as eval_tasks
from tasks.progress import report
from unirl_core.evaluation import run
from unirl_core.evaluation.run import EvalReport, EvalSpec


@flow(name="evaluate", log_prints=True)
def evaluate(spec: EvalSpec) -> EvalReport:
    """Generate and score the prompt set with every model of `spec`; a re-run scores only the missing shards."""
    from unirl_core.tracking.eval_run import log_evaluation

    report("stage", "eval")  # the `unirl` command's progress display
    started = time.monotonic()
    todo = run.prepare(spec)
    count = spec.count()
    report("total_rows", count * len(spec.labels()))
    report("rows", count * len(spec.labels()) - sum(_size(spec, count, shard) for _, shard in todo))
    progress = create_progress_artifact(progress=0.0, key="eval-progress", description="eval: shards done")
    done: list[dict] = []
    for label in spec.labels():  # model by model: one policy on the device at a time
        futures = [eval_tasks.score_shard.submit(spec, label, shard) for name, shard in todo if name == label]
        for future in as_completed(futures):
            done.append(future.result())
            update_progress_artifact(progress, progress=100.0 * len(done) / len(todo))
    result = run.finish(spec)
    generated = sum(d["prompts"] for d in done)
    seconds = sum(d["seconds_generate"] for d in done)
    timing = {"images_generated": generated, "images_per_s": generated / seconds if seconds else 0.0,
              "seconds": time.monotonic() - started}  # fmt: skip
    create_table_artifact(table=table_rows(result), key="eval-summary",
                          description=f"eval of {', '.join(m.ref for m in spec.models)} on {spec.prompts}")  # fmt: skip
    log_evaluation(spec, result, timing)
    return result


def _size(spec: EvalSpec, count: int, shard: int) -> int:
    first, end = spec.shards(count)[shard]
    return end - first


def table_rows(result: EvalReport) -> list[dict]:
    """The summary as table rows, reward by reward: its mean [interval] per model, then the paired difference."""
    rows = []
    for reward in dict.fromkeys(m["reward"] for m in result.metrics):
        for m in (m for m in result.metrics if m["reward"] == reward):
            rows.append({"reward": reward, "model": m["model"], "mean": f"{m['mean']:.4f}",
                         "95% interval": f"[{m['low']:.4f}, {m['high']:.4f}]", "n": m["n"]})  # fmt: skip
        for d in (d for d in result.differences if d["reward"] == reward):
            rows.append({"reward": reward, "model": "model - against", "mean": f"{d['mean']:+.4f}",
                         "95% interval": f"[{d['low']:+.4f}, {d['high']:+.4f}]", "n": d["n"]})  # fmt: skip
    return rows
