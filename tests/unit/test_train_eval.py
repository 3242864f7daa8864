"""`train.eval`'s rules on derived numbers: when points fall, which point is best, when a guard is breached, and the
recipe errors of a bad `train.eval` section."""

from __future__ import annotations

import pytest

from unirl_core.config.schema import Recipe, TrainConfig
from unirl_core.controller.round_plan import plan_rounds
from unirl_core.controller.train_eval import TrainEval, breaches, curve, point_folder
from unirl_core.summaries import EvalPoint

EVAL = {"every": 3, "sets": [{"prompts": "aesthetic", "count": 4}], "rewards": ["jpeg_compressibility", "brightness"]}


def _config(**eval_):
    return TrainConfig.model_validate({"eval": EVAL | eval_, "steps": 7})


def _point(step, jpeg, brightness, reward=None, first_reward=None):
    metrics = {"aesthetic/jpeg_compressibility": {"mean": jpeg, "low": jpeg, "high": jpeg, "n": 4},
               "aesthetic/brightness": {"mean": brightness, "low": brightness, "high": brightness, "n": 4}}  # fmt: skip
    return EvalPoint(step=step, digest="d", metrics=metrics, train_reward=reward, first_train_reward=first_reward)


class _Controller:
    def __init__(self, config, out):
        self.config, self.out = config, out


@pytest.mark.parametrize(
    ("warmup", "steps", "every", "due"),
    [
        (0, 7, 3, [0, 3, 6, 7]),  # before the first step, every 3, after the last
        (0, 6, 3, [0, 3, 6]),  # the last point is a multiple already
        (2, 5, 2, [2, 4, 6, 7]),  # after a warm-up of 2 steps: RL steps 2-6, points from the first RL step
    ],
)
def test_points_fall_before_the_first_rl_step_every_n_steps_and_after_the_last(warmup, steps, every, due, tmp_path):
    config = TrainConfig.model_validate({"eval": EVAL | {"every": every}, "steps": steps, "warmup": {"steps": warmup}})
    assert [r.stage for r in plan_rounds(config)][-1] == "rl"
    train_eval = TrainEval(_Controller(config, tmp_path))
    assert [s for s in range(warmup + steps + 3) if train_eval.due(s)] == due


def test_a_guard_is_breached_when_its_metric_falls_past_the_tolerance_while_the_training_reward_rises():
    config = _config(guards=[{"metric": "aesthetic/brightness", "tolerance": 0.1}]).eval
    first = _point(0, -2.0, 0.50)
    fell_reward_rose = _point(3, -1.5, 0.35, reward=-1.6, first_reward=-2.0)  # 0.35 < 0.50 - 0.1
    found = breaches(config, [first, fell_reward_rose])
    assert [(step, guard.metric) for step, guard, _ in found] == [(3, "aesthetic/brightness")]
    message = found[0][2]
    assert "fell from 0.5000 (step 0) to 0.3500 (step 3)" in message and "rose from -2.0000 to -1.6000" in message

    assert breaches(config, [first, _point(3, -1.5, 0.41, -1.6, -2.0)]) == []  # within the tolerance (0.41 > 0.40)
    assert breaches(config, [first, _point(3, -1.5, 0.10, -2.1, -2.0)]) == []  # fell, but the reward did not rise
    assert breaches(config, [first, _point(3, -1.5, 0.10, None, -2.0)]) == []  # no training reward known: no breach
    assert breaches(config, [first]) == []  # the first point is the reference


def test_the_best_step_is_the_highest_value_of_the_best_metric_the_earliest_of_a_tie(tmp_path):
    config = _config(best="aesthetic/brightness")
    for point in (_point(0, -2.0, 0.3), _point(3, -1.0, 0.6), _point(6, -0.5, 0.6), _point(7, -0.1, float("nan"))):
        folder = point_folder(tmp_path, point.step)
        folder.mkdir(parents=True)
        (folder / "point.json").write_text(point.model_dump_json())
    found = curve(config, tmp_path, current="d")
    assert [p.step for p in found.points] == [0, 3, 6, 7]
    assert (found.best_metric, found.best_step, found.best_value) == ("aesthetic/brightness", 3, 0.6)
    assert curve(_config(), tmp_path, current="d").best_step == 7  # default: the first set's first reward
    assert curve(_config(), tmp_path, current="other").points == []  # points of other settings are not on it
    assert curve(TrainConfig(), tmp_path) is None  # no train.eval


@pytest.mark.parametrize(
    ("eval_", "path", "fix"),
    [
        ({"guards": [{"metric": "aesthetic/pickscore"}]}, "train.eval.guards.0.metric", "aesthetic/brightness"),
        ({"best": "ocr/brightness"}, "train.eval.best", "<set>/<reward>"),
        ({"sets": [{"prompts": "a.txt"}, {"prompts": "b/a.jsonl"}]}, "train.eval.sets.1.name", "no other set"),
        ({"sets": [{"prompts": "x.txt", "name": "a/b"}]}, "train.eval.sets.0.name", "without '/'"),
        ({"rewards": ["no_such_reward"]}, "train.eval.rewards.0", "an unknown reward"),
        ({"rewards": ["brightness", "nomodule.x:fn"]}, "train.eval.rewards.1", "an importable reward function"),
        ({"rewards": ["pickscore"]}, "train.reward.pickscore.model_path", "pickscore is in train.eval.rewards"),
    ],
)
def test_a_bad_eval_section_is_a_recipe_error_naming_its_path(eval_, path, fix):
    recipe = Recipe.model_validate({"train": {"eval": EVAL | eval_}})
    problems = {f"{p}": message for p, _, message in recipe.problems()}
    assert path in problems, problems
    assert fix in problems[path]


@pytest.mark.parametrize(("items", "workers"), [(1, 4), (3, 8), (5, 2), (4, 2), (7, 3)])
def test_evaluation_shares_are_equal_and_cover_every_item_in_order(items, workers):
    from unirl_core.controller.round_plan import indexed_shares

    shares = indexed_shares(list(range(items)), workers)
    assert len(shares) == workers and len({len(share) for share, _ in shares}) == 1  # the same passes on every rank
    flat = [x for share, _ in shares for x in share]
    assert flat[:items] == list(range(items))  # the results of the first `items` are the items', in order
    assert [first for _, first in shares] == [r * len(shares[0][0]) for r in range(workers)]


def test_an_edit_family_with_train_eval_is_a_recipe_error():
    recipe = Recipe.model_validate({"train": {"eval": EVAL, "model": {"family": "qwen_image_edit"}}})
    problems = {p: message for p, _, message in recipe.problems()}
    assert "condition image" in problems["train.eval"]
    assert "train.eval" not in {p for p, _, _ in Recipe.model_validate({"train": {"eval": EVAL}}).problems()}
