"""The promotion gate's decision: a candidate version becomes champion only when it beats the champion on every gate
metric, judged on one `unirl eval --against` of the two versions (the same prompts and noise).

A gate metric passes when the lower bound of the paired difference's 95 % interval (candidate - champion) is above
its margin: ahead by more than the margin, with 95 % confidence. A tie, or a gain the prompts cannot tell from
noise, keeps the champion.
"""

from __future__ import annotations

from pydantic import BaseModel


class GateRow(BaseModel):
    reward: str
    margin: float
    mean: float  # candidate - champion, over the prompts
    low: float
    high: float
    passed: bool


class Promotion(BaseModel):
    """What the gate decided for one candidate version (`promoted`, and `reason` in words)."""

    model_name: str
    candidate: str  # its version number
    champion_before: str | None  # the version it was compared with (None: there was none)
    promoted: bool
    reason: str
    gate: list[GateRow] = []
    reported: list[dict] = []  # the rewards scored beside the gate (paired differences)
    eval_dir: str | None = None


def judge(differences: list[dict], gate) -> list[GateRow]:
    """Each gate metric's row from an evaluation's paired differences (`EvalReport.differences`)."""
    by_reward = {d["reward"]: d for d in differences}
    rows = []
    for metric in gate:
        d = by_reward[metric.reward]
        passed = d["low"] == d["low"] and d["low"] > metric.margin  # NaN (fewer than 2 prompts) never passes
        rows.append(GateRow(reward=metric.reward, margin=metric.margin, mean=d["mean"], low=d["low"], high=d["high"],
                            passed=passed))  # fmt: skip
    return rows


def reason(rows: list[GateRow], champion: str) -> str:
    """Why the gate decided as it did, one line."""

    def said(row: GateRow) -> str:
        return f"{row.reward} {row.mean:+.4f} [{row.low:+.4f}, {row.high:+.4f}] vs margin {row.margin:g}"

    failed = [row for row in rows if not row.passed]
    if failed:
        return f"not ahead of champion version {champion} on " + "; ".join(map(said, failed))
    return f"ahead of champion version {champion} on " + "; ".join(map(said, rows))


def markdown(promotion: Promotion) -> str:
    """The decision as a Prefect artifact (a table of the gate, then what was reported beside it)."""
    verdict = "promoted to champion" if promotion.promoted else "stays candidate"
    lines = [f"**{promotion.model_name} version {promotion.candidate}: {verdict}.** {promotion.reason}", ""]
    if promotion.gate:
        lines += ["| gate metric | candidate - champion | 95% interval | margin | passed |", "|---|---|---|---|---|"]
        lines += [f"| {r.reward} | {r.mean:+.4f} | [{r.low:+.4f}, {r.high:+.4f}] | {r.margin:g} | "
                  f"{'yes' if r.passed else 'no'} |" for r in promotion.gate]  # fmt: skip
    for d in promotion.reported:
        lines.append(f"- reported: {d['reward']} {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]")
    if promotion.eval_dir:
        lines.append(f"- evaluation: `{promotion.eval_dir}`")
    return "\n".join(lines)
