"""The promotion flow (`unirl promote`, and the pipeline's last stage when the recipe has a `promote` section):
the candidate version against the champion version (the `evaluate` flow as a subflow, both versions pinned by
number), the gate's decision (`unirl_core/evaluation/promote.py`) recorded on the candidate version (MLflow tags
and description; the champion alias moved when it wins), a `promotion` markdown artifact and a
`unirl.model.promoted` or `unirl.model.rejected` Prefect event.
"""

from __future__ import annotations

from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event

from flows.engine import flow
from flows.evaluate import evaluate
from tasks.progress import report
from unirl_core.config.schema import PromoteConfig, TrainConfig
from unirl_core.errors import UserError
from unirl_core.evaluation.promote import Promotion, judge, markdown, reason
from unirl_core.evaluation.run import NotComparableError, build_spec, check_folder


def model_name_of(recipe) -> str:
    """The registered model the gate judges: `promote.model_name`, else the training's registered model."""
    if recipe.promote and recipe.promote.model_name:
        return recipe.promote.model_name
    if recipe.train and recipe.train.tracking.registered_model:
        return recipe.train.tracking.registered_model
    return f"unirl-{recipe.name or 'train'}"


@flow(name="promote", log_prints=True)
def promote(config: PromoteConfig, model_name: str, recipe_train: TrainConfig | None = None) -> Promotion:
    """Decide whether the candidate version of `model_name` becomes champion; `recipe_train` gives the default
    prompts and the reward models' settings."""
    from unirl_core.tracking.model_versions import alias_version, record_decision

    report("stage", "promote")
    candidate = alias_version(model_name, config.candidate_alias)
    if candidate is None:
        raise UserError(f"{model_name}: no version has alias {config.candidate_alias!r}; train first (it registers "
                        "one) or set promote.candidate_alias")  # fmt: skip
    champion = alias_version(model_name, config.champion_alias)
    if champion == candidate:
        return Promotion(model_name=model_name, candidate=candidate, champion_before=champion, promoted=True,
                         reason=f"version {candidate} is the champion already")  # fmt: skip
    if champion is None:
        promotion = Promotion(model_name=model_name, candidate=candidate, champion_before=None, promoted=True,
                              reason=f"the first version: no {config.champion_alias} to beat")  # fmt: skip
    else:
        promotion = _against_champion(config, model_name, candidate, champion, recipe_train)
    decision = "promoted" if promotion.promoted else "rejected"
    tags = {"unirl.promotion": decision, "unirl.promotion.reason": promotion.reason[:5000],
            "unirl.promotion.against": champion or ""}  # fmt: skip
    tags |= {
        f"unirl.promotion.{row.reward}": f"{row.mean:+.4f} [{row.low:+.4f}, {row.high:+.4f}]" for row in promotion.gate
    }
    note = f"**Promotion**: {'became ' + config.champion_alias if promotion.promoted else 'stays ' + config.candidate_alias}: {promotion.reason}."
    record_decision(model_name, candidate, tags, note, alias=config.champion_alias if promotion.promoted else None)
    create_markdown_artifact(markdown=markdown(promotion), key="promotion", description=f"promotion of {model_name}")
    emit_event(
        event=f"unirl.model.{decision}",
        resource={"prefect.resource.id": f"unirl.model.{model_name}.{candidate}", "prefect.resource.name": model_name},
        payload=promotion.model_dump(mode="json"),
    )
    print(f"{model_name} version {candidate}: {decision} ({promotion.reason})")
    return promotion


def _against_champion(config: PromoteConfig, model_name: str, candidate: str, champion: str, recipe_train):
    """The candidate evaluated against the champion (the `evaluate` flow) and judged by the gate; a champion of
    another family cannot be compared and stays."""
    gated = [m.reward for m in config.gate]
    prompts = config.prompts or (recipe_train.data.eval_data_path if recipe_train else None)
    if not prompts:
        raise UserError("promote.prompts: the gate needs a prompt file or set (or train.data.eval_data_path)")
    try:
        spec = build_spec(f"models:/{model_name}/{candidate}", f"models:/{model_name}/{champion}", recipe_train,
                          prompts, gated + [r for r in config.report if r not in gated], config.steps, config.guidance,
                          config.seed, config.shard_size, config.batch_size, device=config.device)  # fmt: skip
    except NotComparableError as exc:
        return Promotion(model_name=model_name, candidate=candidate, champion_before=champion, promoted=False,
                         reason=f"not comparable with champion version {champion} ({exc}); move the "
                         f"{config.champion_alias} alias by hand to replace it")  # fmt: skip
    check_folder(spec)
    result = evaluate(spec)
    rows = judge(result.differences, config.gate)
    return Promotion(model_name=model_name, candidate=candidate, champion_before=champion,
                     promoted=all(row.passed for row in rows), reason=reason(rows, champion), gate=rows,
                     reported=[d for d in result.differences if d["reward"] not in gated], eval_dir=spec.output_dir)  # fmt: skip
