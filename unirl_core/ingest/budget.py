"""The error budget: when skipped rows mean the input is bad and the run must fail instead of shipping a dataset.

Two checks (the rule is documented on `DownloadImagesConfig.error_budget_min_rows`):

    judge_unit     at the end of a unit, before it is committed: only a unit of at least `error_budget_min_rows`
                   rows is judged on its own (2 bad rows in a 2-row tail unit say nothing about the input)
    judge_dataset  before reorganize_tar writes a shard: all units' rows together, so a dataset of small units
                   that is bad as a whole still fails; its committed units are kept for a re-run
"""

from __future__ import annotations

from collections import Counter

from unirl_core.config.ingest import DownloadImagesConfig
from unirl_core.errors import UserError


class ErrorBudgetExceeded(UserError, RuntimeError):
    """Too many rows were skipped: the run fails instead of shipping an empty dataset."""


def judge_unit(what: str, count: int, reasons: Counter, stage: DownloadImagesConfig) -> None:
    """ErrorBudgetExceeded for a unit of at least `error_budget_min_rows` rows skipping more than the budget."""
    if count >= stage.error_budget_min_rows:
        _judge(what, count, reasons, stage.error_budget, hint="nothing of this unit is committed")


def judge_dataset(root: str, stats: list[dict], stage: DownloadImagesConfig) -> None:
    """ErrorBudgetExceeded when all units together (their committed stats) skip more than the budget."""
    reasons: Counter = Counter()
    for s in stats:
        reasons.update(s["skip_reasons"])
    worst = sorted(stats, key=lambda s: -sum(s["skip_reasons"].values()) / max(s["count"], 1))[:3]
    units = ", ".join(f"{_unit_name(s)} ({sum(s['skip_reasons'].values())} of {s['count']})" for s in worst)
    _judge(
        f"dataset {root} ({len(stats)} units)",
        sum(s["count"] for s in stats),
        reasons,
        stage.error_budget,
        hint=f"worst units: {units}; the committed units are kept and reused by a re-run, no shard was (re)written",
    )


def _judge(what: str, count: int, reasons: Counter, budget: float, hint: str) -> None:
    skipped = sum(reasons.values())
    if count and skipped / count > budget:
        histogram = ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items(), key=lambda r: (-r[1], r[0])))
        raise ErrorBudgetExceeded(
            f"{what}: {skipped} of {count} rows skipped ({skipped / count:.0%} > error_budget {budget:.0%}); "
            f"reasons: {histogram}; {hint}. Fix the input, or raise download_images.error_budget if this is expected"
        )


def _unit_name(stats: dict) -> str:
    return stats["tar"]["name"].removesuffix(".tar")
