"""`train.eval`: scored evaluation of prompt sets during RL, on the training's own ranks and weights (EMA when kept).

    <output_dir>/eval/step_<L>/<set>.parquet   per-prompt scores: index, prompt_id, prompt, one column per reward
    <output_dir>/eval/step_<L>/point.json      the point's metrics (per `<set>/<reward>`: mean, bootstrap 95 %
                                               interval, n), the training reward beside it; written last (the
                                               point's commit record)

A point L holds the weights before global step L trains: the first RL step (the model RL starts from), every
`every` RL steps after it, and the end (after the last step). Each metric goes to MLflow as `reward/eval/<set>/<reward>` at
step L (the training reward of step L was measured on the same weights), its table as an artifact under
`eval/step_<L>/`; tags `unirl.eval.best_step`/`unirl.eval.best` follow the best point of `train.eval.best`.

Exactly once: a point is computed after the step before it trains and before that step's checkpoint commits; a
resume drops the points past its committed step + 1 (their weights were lost) and computes a due point it lacks.
Generation draws from per-prompt generators and leaves the ranks' global RNG as it was, so a run with an
evaluation trains as it would without one.

The curve holds the points of the current settings (`digest`: sets and their files, rewards, steps, guidance, seed;
`train.eval` may change on a resume). A guard (`train.eval.guards`) is breached at point L when its metric fell below
its value at the curve's first point by more than its tolerance while the training reward rose: the mean
`reward_mean` of the steps since the previous point above the first RL step's. A breach is logged (the point's line,
an MLflow tag, the summary); with `stop` the run fails with the reason once the step's checkpoint commits (and the
round's grids are drawn), and a rerun stops there again until the guard changes.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import shutil
import time
from pathlib import Path

from unirl_core.controller.round_plan import output_dir
from unirl_core.errors import UserError
from unirl_core.summaries import EvalCurve, EvalPoint

POINT_FILE = "point.json"


class EvalGuardError(UserError, RuntimeError):
    """A guard with `stop: true` was breached: the run stops (its checkpoints kept)."""


def point_folder(out: Path, step: int) -> Path:
    return out / "eval" / f"step_{step:08d}"


def digest(config) -> str:
    """What a point's numbers depend on besides the weights (`config`: the TrainConfig): the sets and their files'
    bytes, the rewards and their settings, steps, guidance and seed. A point of another digest is not on the curve."""
    from unirl_core.evaluation import prompt_sets

    settings = config.eval
    identity = {"sets": [s.model_dump(mode="json") for s in settings.sets], "rewards": settings.rewards,
                "reward": config.eval_reward().model_dump(mode="json"), "steps": settings.steps,
                "guidance": settings.guidance, "seed": config.sampling.seed,
                "prompts": {s.label(): _file_digest(prompt_sets.resolve(s.prompts)) for s in settings.sets}}  # fmt: skip
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def breaches(config, points: list[EvalPoint]) -> list[tuple[int, object, str]]:
    """(step, guard, message) of every guard breached at a point after the first (`config`: `train.eval`)."""
    if not points:
        return []
    first, found = points[0], []
    for point in points[1:]:
        rose = None not in (point.train_reward, point.first_train_reward) and (
            point.train_reward > point.first_train_reward
        )
        for guard in config.guards:
            if guard.metric not in point.metrics or guard.metric not in first.metrics:
                continue
            now, then = point.metrics[guard.metric]["mean"], first.metrics[guard.metric]["mean"]
            if rose and now < then - guard.tolerance:
                found.append((point.step, guard, (
                    f"eval/{guard.metric} fell from {then:.4f} (step {first.step}) to {now:.4f} (step {point.step}), "
                    f"more than its tolerance {guard.tolerance:g}, while the training reward rose from "
                    f"{point.first_train_reward:.4f} to {point.train_reward:.4f}"
                )))  # fmt: skip
    return found


def curve(config, out: Path, current: str | None = None) -> EvalCurve | None:
    """The run's points on disk of the current settings (`config`: the TrainConfig; `current`: their digest when
    known), its best point and the guards' breaches; None without `eval`."""
    if config.eval is None:
        return None
    current = current or digest(config)
    points = []
    for file in sorted((out / "eval").glob(f"step_*/{POINT_FILE}")):
        point = EvalPoint.model_validate_json(file.read_text())
        if point.digest == current:  # a point of earlier settings (train.eval changed on a resume) is left out
            points.append(point)
    metric = config.eval.best_metric()
    scored = [p for p in points if metric in p.metrics and p.metrics[metric]["mean"] == p.metrics[metric]["mean"]]
    best = max(scored, key=lambda p: (p.metrics[metric]["mean"], -p.step), default=None)
    return EvalCurve(
        points=points, best_metric=metric, best_step=best.step if best else None,
        best_value=best.metrics[metric]["mean"] if best else None,
        breaches=[f"step {step}: {message}" for step, _, message in breaches(config.eval, points)],
    )  # fmt: skip


def guard_stop(config, step: int, points: list[EvalPoint] | None = None) -> EvalGuardError | None:
    """The error that stops the run at the point of `step` when a guard with `stop` is breached there (None
    without one)."""
    if config.eval is None:
        return None
    if points is None:
        points = curve(config, output_dir(config)).points
    stops = [m for at, guard, m in breaches(config.eval, points) if at == step and guard.stop]
    if not stops:
        return None
    return EvalGuardError(
        f"train.eval.guards: {stops[0]}; the run stopped before step {step} (checkpoint step {step - 1} committed): "
        "look at the eval curve, then change the rewards, or raise the guard's tolerance or set its stop: false and "
        "run again to go on"
    )


def eval_line(row: dict) -> str:
    """An evaluation as a log line: `eval at step 4: aesthetic/jpeg_compressibility -1.3821 [-1.3850, -1.3793], ...`."""
    parts = [f"{name} {m['mean']:.4f} [{m['low']:.4f}, {m['high']:.4f}]" for name, m in row["eval"].items()]
    line = f"eval at step {row['step']}: {', '.join(parts)}"
    return line + "".join(f"; GUARD BREACHED: {message}" for message in row.get("breaches", []))


class TrainEval:
    """The evaluation points of one RL round, driven by its strategy (`controller`: config, group, out, tracking)."""

    def __init__(self, controller):
        from unirl_core.controller.round_plan import plan_rounds

        self.c, self.config = controller, controller.config.eval
        rl = [r for r in plan_rounds(controller.config) if r.stage == "rl"]
        self.first, self.end = rl[0].first, rl[-1].end
        self._examples: dict[str, list] | None = None

    @functools.cached_property
    def digest(self) -> str:
        return digest(self.c.config)

    def due(self, step: int) -> bool:
        """Whether a point falls at global step `step` (weights before it trains)."""
        return self.first <= step <= self.end and ((step - self.first) % self.config.every == 0 or step == self.end)

    def drop_past(self, committed: int) -> None:
        """Remove the points whose weights a resume lost (after the committed step + 1)."""
        for folder in sorted((self.c.out / "eval").glob("step_*")):
            if folder.is_dir() and int(folder.name.removeprefix("step_")) > committed + 1:
                shutil.rmtree(folder)

    def run(self, step: int, deadline: float) -> EvalPoint | None:
        """The point at `step` when one is due: read when committed with these settings, else computed, logged and
        written."""
        if not self.due(step):
            return None
        file = point_folder(self.c.out, step) / POINT_FILE
        if file.is_file():  # committed (and logged) before a resume
            point = EvalPoint.model_validate_json(file.read_text())
            if point.digest == self.digest:
                return point
        return self._compute(step, deadline)

    def stop_error(self, point: EvalPoint | None) -> EvalGuardError | None:
        """The error that stops the run at `point` when a guard with `stop` is breached there."""
        return None if point is None else guard_stop(self.c.config, point.step, self._points())

    # --- work ---------------------------------------------------------------------------------------------------

    def _path(self, eval_set) -> str:
        from unirl_core.evaluation import prompt_sets

        return prompt_sets.resolve(eval_set.prompts)

    def examples(self) -> dict[str, list]:
        from unirl_core.data.prompts import load_prompts

        if self._examples is None:
            self._examples = {s.label(): load_prompts(self._path(s))[: s.count] for s in self.config.sets}
        return self._examples

    def _compute(self, step: int, deadline: float) -> EvalPoint:
        """Score every set on the ranks; write the tables, log the point to MLflow, then commit `point.json` (a
        point lost before its commit is computed again; MLflow keeps the step it holds)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from unirl_core.controller.round_plan import indexed_shares
        from unirl_core.io.storage import write_bytes_atomic
        from unirl_core.worker.worker import TrainWorker

        c, config = self.c, self.config
        started, folder = time.perf_counter(), point_folder(c.out, step)
        reward_json = c.config.eval_reward().model_dump_json()
        metrics: dict[str, dict[str, float]] = {}
        for label, examples in self.examples().items():
            items = [(e.prompt, e.metadata) for e in examples]
            parts = c.group.scatter(TrainWorker.evaluate_scores, indexed_shares(items, c.workers),
                                    c.config.sampling.seed, config.steps, config.guidance, config.batch_size,
                                    reward_json, timeout=c._remaining(deadline, step))  # fmt: skip
            scores = {name: [x for part in parts for x in part[name]][: len(items)] for name in config.rewards}
            columns = {
                "index": pa.array(range(len(items)), pa.int64()),
                "prompt_id": pa.array([e.prompt_id for e in examples], pa.string()),
                "prompt": pa.array([e.prompt for e in examples], pa.string()),
            } | {name: pa.array(scores[name], pa.float64()) for name in config.rewards}
            buffer = io.BytesIO()
            pq.write_table(pa.table(columns), buffer)
            write_bytes_atomic(str(folder / f"{label}.parquet"), buffer.getvalue())
            metrics |= {f"{label}/{name}": _estimate(scores[name]) for name in config.rewards}
        train_reward, first_train_reward = self._train_rewards(step)
        point = EvalPoint(step=step, digest=self.digest, metrics=metrics, train_reward=train_reward,
                          first_train_reward=first_train_reward, seconds=time.perf_counter() - started)  # fmt: skip
        c.mlflow_run.log_metrics({f"eval/{name}": m["mean"] for name, m in point.metrics.items()}, point.step)
        for file in sorted(folder.glob("*.parquet")):
            c.mlflow_run.log_file(file, f"eval/step_{point.step:08d}")
        write_bytes_atomic(str(folder / POINT_FILE), point.model_dump_json(indent=1).encode())
        self._announce(point)
        return point

    def _train_rewards(self, step: int) -> tuple[float | None, float | None]:
        """(mean reward_mean of the steps since the previous point, reward_mean of the first RL step), from
        `metrics.jsonl` (a torn last line, left by a kill, is not read)."""
        import numpy as np

        if step == self.first:
            return None, None
        path = self.c.metrics_file.path
        lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
        rows = [json.loads(line) for line in lines if line.endswith("\n")]
        rewards = {r["step"]: r["reward_mean"] for r in rows if r.get("stage") == "rl" and "reward_mean" in r}
        previous = max(s for s in range(self.first, step) if self.due(s))
        window = [rewards[s] for s in range(previous, step) if s in rewards]
        first = rewards.get(self.first)
        return (float(np.mean(window)) if window else None), (None if first is None else float(first))

    def _points(self) -> list[EvalPoint]:
        return curve(self.c.config, self.c.out, self.digest).points

    def _announce(self, point: EvalPoint) -> None:
        """The best point's tags and the point's breaches on the MLflow run; the progress callback."""
        c = self.c
        found = curve(c.config, c.out, self.digest)
        tags = {"unirl.eval.best_step": str(found.best_step),
                "unirl.eval.best": f"{found.best_metric}={found.best_value:.6g}"} if found.best_step is not None else {}  # fmt: skip
        messages = [m for at, _, m in breaches(self.config, found.points) if at == point.step]  # in the point's line
        if messages:
            tags["unirl.eval.guard_breach"] = f"step {point.step}: {messages[0]}"
        c.mlflow_run.set_tags(tags)
        if c.on_eval:
            c.on_eval({"step": point.step, "round": c.round.index, "eval": dict(point.metrics), "breaches": messages})


def _estimate(values: list[float]) -> dict[str, float]:
    """Mean, bootstrap 95 % interval and n of the finite scores, and how many were not finite."""
    import math

    from unirl_core.evaluation import stats

    finite = [v for v in values if math.isfinite(v)]
    return stats.estimate(finite).as_dict() | {"nonfinite": len(values) - len(finite)}


def _file_digest(path: str) -> str:
    """The file's SHA-256; a file gone since (a finished run's summary read later) digests as missing."""
    from unirl_core.io import storage

    try:
        return hashlib.sha256(storage.read_bytes(path)).hexdigest()
    except FileNotFoundError:
        return f"missing: {path}"
