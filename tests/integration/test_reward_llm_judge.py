"""The `llm_judge` reward (text outputs) on a real tiny chat LM (Qwen3ForCausalLM, random weights, its ChatML
template, saved to and loaded from a folder): its score is the model's own next-token softmax over the answer
tokens after the chat template, the same batched and left-padded as one by one, a response's control tokens stay
text; an ar recipe trains on it, and a diffusion recipe refuses it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from unirl_core.config import load_recipe
from unirl_core.models.tiny_lm import write_tiny_lm
from unirl_core.rewards.vlm_judge import TEXT_QUESTIONS, LlmJudgeScore, load_judge

pytestmark = pytest.mark.slow  # real transformers models: a few seconds

PROMPTS = ["3+4=", "What is the capital of France? Answer in one word.", "", "a long question " * 15]
OUTPUTS = ["7", "Paris", "{prompt} {response} stay as written", "no idea<|im_end|>"]


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory):
    return write_tiny_lm(tmp_path_factory.mktemp("judge") / "qwen3", "qwen3")


def by_hand(folder, prompt: str, response: str) -> float:
    """The chat text of one question, tokenized with its control tokens as text, the model's own forward (one row,
    no padding), a softmax over yes/Yes/no/No at the last position: the yes mass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval()
    question = TEXT_QUESTIONS["yes_no"].replace("{prompt}", prompt).replace("{response}", response)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                        sanitize_control_tokens=True, return_dict=True, return_tensors="pt")  # fmt: skip
    assert (ids["input_ids"] == tokenizer.convert_tokens_to_ids("<|im_end|>")).sum() == 2  # the template's own
    with torch.no_grad():
        logits = model(**ids).logits[0, -1]
    probs = torch.softmax(logits[tokenizer.convert_tokens_to_ids(["yes", "Yes", "no", "No"])], -1)
    return float(probs[:2].sum())


def test_the_score_is_the_models_yes_mass_batched_or_not(lm_folder):
    batched = LlmJudgeScore(lm_folder, batch_size=4)(OUTPUTS, PROMPTS)
    assert batched.shape == (4,) and ((batched > 0) & (batched < 1)).all() and len(set(np.round(batched, 5))) == 4
    one_by_one = LlmJudgeScore(lm_folder, batch_size=1)(OUTPUTS, PROMPTS)
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)  # left-padded batches
    hand = [by_hand(lm_folder, p, o) for p, o in zip(PROMPTS[:2], OUTPUTS[:2], strict=True)]
    np.testing.assert_allclose(batched[:2], hand, atol=1e-5)
    assert by_hand(lm_folder, PROMPTS[3], OUTPUTS[3]) == pytest.approx(batched[3], abs=1e-5)
    assert load_judge(lm_folder, reward="llm_judge").model.__class__.__name__ == "Qwen3ForCausalLM"


def test_bad_settings_are_refused_naming_the_reward(lm_folder, tmp_path):
    with pytest.raises(ValueError, match=r"llm_judge question 'Is \{prompt\} right\?' has no \{response\}"):
        LlmJudgeScore(lm_folder, question="Is {prompt} right?")
    with pytest.raises(FileNotFoundError, match="llm_judge model folder .* has no config.json"):
        LlmJudgeScore(tmp_path / "missing")
    with pytest.raises(ValueError, match="vlm_judge model folder .* holds no vision-language model"):
        load_judge(lm_folder)  # an LM as an image judge


def test_an_ar_recipe_trains_on_it_and_a_diffusion_recipe_refuses_it(lm_folder, tmp_path):
    from local_training import train_locally

    judge = [f"train.reward.llm_judge.model_path={lm_folder}", "train.reward.weights={llm_judge: 1.0}"]
    config = load_recipe("demo_llm", [*judge, "train.steps=2", "train.reward.guards=[]"]).train
    rows = train_locally(config, tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1] and 0 < rows[0]["reward_llm_judge_mean"] < 1
    assert rows[0]["grad_norm"] > 0  # the judge's scores differ within a group
    with pytest.raises(Exception, match="llm_judge"):
        load_recipe("demo", judge)
