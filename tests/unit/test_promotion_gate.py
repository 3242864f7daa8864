"""The gate's rule: a metric is won when the paired difference's lower 95 % bound is above its margin; a tie, an
interval that reaches the margin, or no interval (fewer than 2 prompts) keeps the champion."""

from __future__ import annotations

from unirl_core.config.schema import GateMetric
from unirl_core.evaluation.promote import judge, reason


def difference(reward, mean, low, high):
    return {"reward": reward, "mean": mean, "low": low, "high": high, "n": 8}


def test_every_gate_metric_must_clear_its_margin_at_the_lower_bound():
    differences = [difference("pickscore", 0.02, 0.011, 0.03), difference("ocr", 0.05, -0.01, 0.1),
                   difference("geneval", 0.03, 0.02, 0.04), difference("one", 0.5, float("nan"), float("nan"))]  # fmt: skip
    gate = [GateMetric(reward="pickscore", margin=0.01), GateMetric(reward="ocr"),
            GateMetric(reward="geneval", margin=0.02), GateMetric(reward="one")]  # fmt: skip
    rows = judge(differences, gate)
    assert [row.passed for row in rows] == [True, False, False, False]  # 0.02 is not above a margin of 0.02
    said = reason(rows, "4")
    assert said.startswith("not ahead of champion version 4 on ocr +0.0500 [-0.0100, +0.1000] vs margin 0")
    assert "pickscore" not in said  # only what failed is named
    assert reason(rows[:1], "4") == "ahead of champion version 4 on pickscore +0.0200 [+0.0110, +0.0300] vs margin 0.01"


def test_an_unknown_gate_reward_is_a_recipe_error_naming_its_path(tmp_path):
    import pytest
    import yaml

    from unirl_core.config import load_recipe
    from unirl_core.config.recipe import RecipeError, packaged_recipes

    recipe = yaml.safe_load(packaged_recipes()["demo"].read_text())
    recipe["promote"] = {"gate": [{"reward": "jpeg_compressibility"}, {"reward": "pickscor"}], "report": ["brightnes"]}
    path = tmp_path / "gated.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError) as error:
        load_recipe(str(path), [])
    assert "promote.gate.1.reward: got 'pickscor'" in str(error.value)
    assert "promote.report.0: got 'brightnes'" in str(error.value) and "2 error(s)" in str(error.value)
