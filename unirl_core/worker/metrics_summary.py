"""Training metrics summarized for people: the reward trend over a run's steps and the mean of each round.

Numbers only; the `unirl` command formats them. The rows are those of a training's `metrics.jsonl` (one JSON object
per logged step: `step`, `stage` ("warmup" or "rl"), `round` (index within the stage), then the step's metrics).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RewardTrend:
    window: int  # steps averaged at each end
    first: float  # mean reward of the first `window` steps
    last: float  # mean reward of the last `window` steps

    @property
    def change(self) -> float:
        return self.last - self.first


def reward_trend(rewards: Sequence[float], max_window: int = 4) -> RewardTrend:
    """Mean reward of the first and the last `window` steps; `window` is half the steps, between 1 and
    `max_window` (with one step, both ends are that step)."""
    assert rewards, "a reward trend needs at least one step"
    window = max(1, min(max_window, len(rewards) // 2))
    return RewardTrend(window, sum(rewards[:window]) / window, sum(rewards[-window:]) / window)


@dataclass(frozen=True)
class RoundMean:
    stage: str  # "warmup" or "rl"
    index: int  # the round's index within its stage
    metric: str  # what is averaged: "reward_mean" (RL rounds) or "warmup_loss" (warm-up rounds)
    mean: float  # over the round's steps
    steps: int  # steps averaged


ROUND_METRIC = {"rl": "reward_mean", "warmup": "warmup_loss"}


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a `metrics.jsonl`, in the order they were logged."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def round_means(rows: Iterable[dict]) -> list[RoundMean]:
    """Per round, the mean of its metric (ROUND_METRIC) over its steps; warm-up rounds first, then by index. A step
    logged more than once (re-run after a failure, before its checkpoint committed) counts once, its last row."""
    last = {row["step"]: row for row in rows}
    by_round: dict[tuple[str, int], list[float]] = {}
    for row in last.values():
        by_round.setdefault((row["stage"], row["round"]), []).append(row[ROUND_METRIC[row["stage"]]])
    means = []
    for stage, index in sorted(by_round, key=lambda key: (key[0] != "warmup", key[1])):
        values = by_round[(stage, index)]
        means.append(RoundMean(stage, index, ROUND_METRIC[stage], sum(values) / len(values), len(values)))
    return means
