"""`train.eval`: scored evaluation of prompt sets during RL, on the training's own ranks and weights (EMA when kept).

    <output_dir>/eval/step_<L>/<set>.parquet   per-prompt scores: index, prompt_id, prompt, one column per reward
    <output_dir>/eval/step_<L>/point.json      the point's metrics (per `<set>/<reward>`: mean, bootstrap 95 %
                                               interval, n), the training reward beside it; written last (the
                                               point's commit record)

A point L holds the weights before global step L trains: the first RL step (the model RL starts from), every
`every` RL steps after it, and the end (after the last step). Each metric goes to MLflow as `eval/<set>/<reward>` at
step L (the training reward of step L was measured on the same weights), its table as an artifact under
`eval/step_<L>/`; tags `unirl.eval.best_step`/`unirl.eval.best` follow the best point of `train.eval.best`.

Exactly once: a point is computed after the step before it trains and before that step's checkpoint commits; a
resume drops the points past its committed step + 1 (their weights were lost) and computes a due point it lacks.
Generation draws from per-prompt generators and leaves the ranks' global RNG as it was, so a run with an
evaluation trains as it would without one.

A guard (`train.eval.guards`) is breached at point L when its metric fell below its value at the first point by more
than its tolerance while the training reward rose: the mean `reward_mean` of the steps since the previous point
above the first RL step's. A breach is logged (the point's line, an MLflow tag, the summary); with `stop` the run fails with
the reason after the step's checkpoint commits, and a rerun stops there again until the guard changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import time
from pathlib import Path

from unirl_core.errors import UserError
from unirl_core.summaries import EvalCurve, EvalPoint

POINT_FILE = "point.json"


class EvalGuardError(UserError, RuntimeError):
    """A guard with `stop: true` was breached: the run stops (its checkpoints kept)."""


def point_folder(out: Path, step: int) -> Path:
    return out / "eval" / f"step_{step:08d}"


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
            now, then = point.metrics[guard.metric]["mean"], first.metrics[guard.metric]["mean"]
            if rose and now < then - guard.tolerance:
                found.append((point.step, guard, (
                    f"eval/{guard.metric} fell from {then:.4f} (step {first.step}) to {now:.4f} (step {point.step}), "
                    f"more than its tolerance {guard.tolerance:g}, while the training reward rose from "
                    f"{point.first_train_reward:.4f} to {point.train_reward:.4f}"
                )))  # fmt: skip
    return found


def curve(config, out: Path) -> EvalCurve | None:
    """The run's points on disk (`config`: the TrainConfig), its best point and breaches; None without `eval`."""
    if config.eval is None:
        return None
    points = []
    for file in sorted((out / "eval").glob(f"step_*/{POINT_FILE}")):
        points.append(EvalPoint.model_validate_json(file.read_text()))
    metric = config.eval.best_metric()
    scored = [p for p in points if p.metrics.get(metric, {}).get("mean") == p.metrics.get(metric, {}).get("mean")]
    best = max(scored, key=lambda p: (p.metrics[metric]["mean"], -p.step), default=None)
    return EvalCurve(
        points=points, best_metric=metric, best_step=best.step if best else None,
        best_value=best.metrics[metric]["mean"] if best else None,
        breaches=[f"step {step}: {message}" for step, _, message in breaches(config.eval, points)],
    )  # fmt: skip


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

    def due(self, step: int) -> bool:
        """Whether a point falls at global step `step` (weights before it trains)."""
        return self.first <= step <= self.end and ((step - self.first) % self.config.every == 0 or step == self.end)

    def digest(self) -> str:
        config = self.c.config
        identity = {"sets": [s.model_dump(mode="json") for s in self.config.sets], "rewards": self.config.rewards,
                    "reward": config.eval_reward().model_dump(mode="json"), "steps": self.config.steps,
                    "guidance": self.config.guidance, "seed": config.sampling.seed,
                    "prompts": {s.label(): _file_digest(self._path(s)) for s in self.config.sets}}  # fmt: skip
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]

    def drop_past(self, committed: int) -> None:
        """Remove the points whose weights a resume lost (after the committed step + 1)."""
        for folder in sorted((self.c.out / "eval").glob("step_*")):
            if folder.is_dir() and int(folder.name.removeprefix("step_")) > committed + 1:
                shutil.rmtree(folder)

    def run(self, step: int, deadline: float) -> EvalPoint | None:
        """The point at `step` when one is due: read when committed (same digest), else computed, written and
        logged; a guard with `stop` breached there raises EvalGuardError (the caller commits the checkpoint first,
        then raises it: `stop_error`)."""
        if not self.due(step):
            return None
        digest = self.digest()
        file = point_folder(self.c.out, step) / POINT_FILE
        if file.is_file():  # committed (and logged) before a resume
            point = EvalPoint.model_validate_json(file.read_text())
            if point.digest == digest:
                return point
        point = self._compute(step, digest, deadline)
        self._log(point)
        return point

    def stop_error(self, point: EvalPoint | None) -> EvalGuardError | None:
        """The error that stops the run at `point` when a guard with `stop` is breached there."""
        if point is None:
            return None
        stops = [m for step, guard, m in self._breaches() if step == point.step and guard.stop]
        if not stops:
            return None
        return EvalGuardError(
            f"train.eval.guards: {stops[0]}; the run stopped before step {point.step} (checkpoint step "
            f"{point.step - 1} committed): look at the eval curve, then change the rewards, or raise the guard's "
            "tolerance or set its stop: false and run again to go on"
        )

    # --- work ---------------------------------------------------------------------------------------------------

    def _path(self, eval_set) -> str:
        from unirl_core.evaluation import prompt_sets

        return prompt_sets.resolve(eval_set.prompts)

    def examples(self) -> dict[str, list]:
        from unirl_core.data.prompts import load_prompts

        if self._examples is None:
            self._examples = {s.label(): load_prompts(self._path(s))[: s.count] for s in self.config.sets}
        return self._examples

    def _compute(self, step: int, digest: str, deadline: float) -> EvalPoint:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from unirl_core.controller.round_plan import indexed_shares
        from unirl_core.evaluation import stats
        from unirl_core.io.storage import write_bytes_atomic
        from unirl_core.worker.worker import TrainWorker

        c, config, workers = self.c, self.config, self.c.workers
        started, folder = time.perf_counter(), point_folder(c.out, step)
        reward_json = c.config.eval_reward().model_dump_json()
        metrics: dict[str, dict[str, float]] = {}
        for label, examples in self.examples().items():
            items = [(e.prompt, e.metadata) for e in examples]
            parts = c.group.scatter(TrainWorker.evaluate_scores, indexed_shares(items, workers),
                                    c.config.sampling.seed, config.steps, config.guidance, config.batch_size,
                                    reward_json, timeout=deadline - time.monotonic())  # fmt: skip
            scores = {name: [x for part in parts for x in part[name]][: len(items)] for name in config.rewards}
            columns = {
                "index": pa.array(range(len(items)), pa.int64()),
                "prompt_id": pa.array([e.prompt_id for e in examples], pa.string()),
                "prompt": pa.array([e.prompt for e in examples], pa.string()),
            } | {name: pa.array(scores[name], pa.float64()) for name in config.rewards}
            buffer = io.BytesIO()
            pq.write_table(pa.table(columns), buffer)
            write_bytes_atomic(str(folder / f"{label}.parquet"), buffer.getvalue())
            metrics |= {f"{label}/{name}": stats.estimate(scores[name]).as_dict() for name in config.rewards}
        train_reward, first_train_reward = self._train_rewards(step)
        point = EvalPoint(step=step, digest=digest, metrics=metrics, train_reward=train_reward,
                          first_train_reward=first_train_reward, seconds=time.perf_counter() - started)  # fmt: skip
        write_bytes_atomic(str(folder / POINT_FILE), point.model_dump_json(indent=1).encode())
        return point

    def _train_rewards(self, step: int) -> tuple[float | None, float | None]:
        """(mean reward_mean of the steps since the previous point, reward_mean of the first RL step)."""
        import numpy as np

        if step == self.first:
            return None, None
        path = self.c.metrics_file.path
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
        rewards = {r["step"]: r["reward_mean"] for r in rows if r.get("stage") == "rl" and "reward_mean" in r}
        previous = max(s for s in range(self.first, step) if self.due(s))
        window = [rewards[s] for s in range(previous, step) if s in rewards]
        first = rewards.get(self.first)
        return (float(np.mean(window)) if window else None), (None if first is None else float(first))

    def _points(self) -> list[EvalPoint]:
        found = curve(self.c.config, self.c.out)
        return found.points if found else []

    def _breaches(self):
        return breaches(self.config, self._points())

    def _log(self, point: EvalPoint) -> None:
        """MLflow (metrics at the point's step, its tables, the best point's tags), the warnings of its breaches,
        and the progress callback."""
        c = self.c
        c.mlflow_run.log_metrics({f"eval/{name}": m["mean"] for name, m in point.metrics.items()}, point.step)
        for file in sorted(point_folder(c.out, point.step).glob("*.parquet")):
            c.mlflow_run.log_file(file, f"eval/step_{point.step:08d}")
        found = curve(c.config, c.out)
        tags = {"unirl.eval.best_step": str(found.best_step),
                "unirl.eval.best": f"{found.best_metric}={found.best_value:.6g}"} if found.best_step is not None else {}  # fmt: skip
        messages = [m for step, _, m in self._breaches() if step == point.step]  # shown in the point's line
        if messages:
            tags["unirl.eval.guard_breach"] = f"step {point.step}: {messages[0]}"
        c.mlflow_run.set_tags(tags)
        if c.on_eval:
            c.on_eval({"step": point.step, "round": c.round.index, "eval": dict(point.metrics), "breaches": messages})


def _file_digest(path: str) -> str:
    from unirl_core.io import storage

    return hashlib.sha256(storage.read_bytes(path)).hexdigest()
