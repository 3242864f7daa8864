"""The text rewards of the autoregressive domain score completions against their prompt records' metadata, through
the reward service as a round calls it; a record without the key fails naming the sample; a recipe that pairs a
domain with rewards of the other modality is refused on loading, naming both."""

from __future__ import annotations

import pytest

from unirl_core.config import load_recipe
from unirl_core.config.recipe import RecipeError
from unirl_core.rewards.errors import RewardError
from unirl_core.rewards.service import RewardService


def score(names: list[str], outputs: list[str], metadata: list[dict]) -> dict:
    service = RewardService({name: 1.0 for name in names})
    return {k: v.tolist() for k, v in service.score(outputs, ["p"] * len(outputs), [f"s{i}" for i in
                                                   range(len(outputs))], metadata).items()}  # fmt: skip


def test_math_verify_accepts_equal_answers_in_any_form():
    outputs = ["7", "The answer is $\\frac{14}{2}$", "0.5", "8", "", "\\boxed{1/2}"]
    metadata = [{"answer": "7"}, {"answer": "7"}, {"answer": "1/2"}, {"answer": "7"}, {"answer": "7"},
                {"answer": "0.5"}]  # fmt: skip
    assert score(["math_verify"], outputs, metadata)["math_verify"] == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]


def test_exact_and_regex_match_read_their_metadata_keys():
    metadata = [{"answer": "7", "pattern": r"\d+"}, {"answer": ["7", "seven"], "pattern": r"\d+"},
                {"answer": "7", "pattern": r"\d+"}]  # fmt: skip
    got = score(["exact_match", "regex_match"], [" 7\n", "seven", "7."], metadata)
    assert got["exact_match"] == [1.0, 1.0, 0.0] and got["regex_match"] == [1.0, 0.0, 0.0]
    assert got["total"] == [2.0, 1.0, 0.0]


def test_think_answer_wants_reasoning_then_an_answer():
    outputs = ["<think>3 and 4</think> <answer>7</answer>", "<answer>7</answer>", "<think>x</think><answer>7"]
    assert score(["think_answer"], outputs, [{}] * 3)["think_answer"] == [1.0, 0.0, 0.0]


def test_a_record_without_the_key_fails_naming_the_sample():
    with pytest.raises(RewardError, match=r"sample 1's prompt record has no metadata.answer"):
        score(["exact_match"], ["7", "7"], [{"answer": "7"}, {}])


def test_a_domain_refuses_rewards_of_the_other_modality_naming_both():
    with pytest.raises(
        RecipeError,
        match=r"train.reward.weights.jpeg_compressibility.*outputs are texts, and "
        r"jpeg_compressibility scores images",
    ):
        load_recipe("demo_llm", ["train.reward.weights={jpeg_compressibility: 1.0}"])
    with pytest.raises(
        RecipeError,
        match=r"train.reward.guards.exact_match.*outputs are images, and exact_match "
        r"scores texts",
    ):
        load_recipe("demo", ["train.reward.guards=[exact_match]"])
    with pytest.raises(RecipeError, match=r"train.eval.rewards.edge_density.*outputs are texts"):
        load_recipe(
            "demo_llm", ["train.eval={every: 4, sets: [{prompts: aesthetic, count: 4}], rewards: [edge_density]}"]
        )
    with pytest.raises(RecipeError, match=r"train.algorithm.name.*token algorithm"):
        load_recipe("demo_llm", ["train.algorithm={name: grpo}"])
    with pytest.raises(RecipeError, match=r"train.algorithm.eta: got 0.3; left out: a denoising setting"):
        load_recipe("demo_llm", ["train.algorithm.eta=0.3"])
    with pytest.raises(RecipeError, match=r"train.algorithm.beta.*full fine-tuning"):
        load_recipe("demo_llm", ["train.algorithm.beta=0.04"])
