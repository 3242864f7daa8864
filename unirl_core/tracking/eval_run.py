"""The MLflow run of one evaluation (`unirl eval`), in experiment `unirl-eval`: the spec as params, each reward's
mean and interval per model (`<reward>/<label>/mean`, `/low`, `/high`) and the paired differences
(`<reward>/difference/...`), images/s, the per-prompt scores (results.parquet), summary.json, and a grid of the
model's best and worst prompts on the first reward. The run id is kept in the evaluation's folder, so a re-run
logs into the same run; when MLflow is down the evaluation still completes (a warning says what was not logged).
"""

from __future__ import annotations

from pathlib import Path

from unirl_core.tracking.run_tracker import RunTracker

EXPERIMENT = "unirl-eval"
GRID_EACH = 4  # best and worst prompts in the grid


def log_evaluation(spec, report, timing: dict) -> str | None:
    """Log `report` of `spec`; returns the run id (None when MLflow is out of reach)."""
    from unirl_core.evaluation.run import RESULTS_FILE, SUMMARY_FILE

    folder = Path(spec.output_dir)
    tracker = RunTracker(folder, EXPERIMENT, f"eval-{report.key}",
                         tags={"unirl.eval.key": report.key, "unirl.eval.model": spec.models[0].ref},
                         sectioned=False)  # fmt: skip
    params = {"model": spec.models[0].ref, "against": spec.models[1].ref if len(spec.models) > 1 else "",
              "prompts": spec.prompts, "prompts_sha256": spec.prompts_sha256[:16], "prompts_count": report.prompts,
              "rewards": ",".join(spec.rewards), "steps": spec.steps, "guidance": spec.guidance,
              "size": f"{spec.width}x{spec.height}", "seed": spec.seed}  # fmt: skip
    run_id = tracker.open(params=params, description=_description(spec, report))
    if run_id is None:
        return None
    metrics = {f"{m['reward']}/{m['model']}/{k}": m[k] for m in report.metrics for k in ("mean", "low", "high")}
    metrics |= {f"{d['reward']}/difference/{k}": d[k] for d in report.differences for k in ("mean", "low", "high")}
    if timing.get("images_generated"):
        metrics["images_per_s"] = timing["images_per_s"]
    tracker.log_metrics({k: v for k, v in metrics.items() if v == v}, step=0)  # NaN (n < 2): left out
    for name in (RESULTS_FILE, SUMMARY_FILE):
        tracker.log_file(folder / name)
    grid = _best_and_worst(spec, report)
    if grid is not None:
        grid_file = folder / "best_and_worst.png"
        grid.save(grid_file)
        tracker.log_file(grid_file)
    tracker.finish()
    return run_id


def _description(spec, report) -> str:
    lines = [f"`unirl eval` of {spec.models[0].ref}" + (f" against {spec.models[1].ref}" if len(spec.models) > 1
             else "") + f" on {report.prompts} prompts of {spec.prompts} ({spec.steps} steps, guidance "
             f"{spec.guidance:g}, seed {spec.seed})."]  # fmt: skip
    for d in report.differences:
        lines.append(f"- {d['reward']}: model - against = {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]")
    return "\n".join(lines)


def _best_and_worst(spec, report):
    """The model's GRID_EACH best then worst prompts on the first reward, one captioned row each."""
    from PIL import Image

    from unirl_core.domains.registry import domain_class
    from unirl_core.evaluation.run import read_scores

    reward = spec.rewards[0]
    scores = read_scores(spec, "model", report.prompts)
    order = sorted(range(len(scores["index"])), key=lambda i: (scores[reward][i], scores["index"][i]))
    picked = [("best", i) for i in order[::-1][:GRID_EACH]] + [("worst", i) for i in order[:GRID_EACH]]
    if len(order) < 2 * GRID_EACH:
        picked = [("", i) for i in order[::-1]]
    if "output" in scores:  # a text domain's completions
        images = [scores["output"][i] for _, i in picked]
    else:
        images = [Image.open(spec.image_file("model", scores["index"][i])).convert("RGB") for _, i in picked]
    captions = [f"{kind} {reward} {scores[reward][i]:.4f}: {scores['prompt'][i]}".strip() for kind, i in picked]
    return domain_class(spec.models[0].config.domain.name).grid(images, captions, cols=1)
