"""The `vlm_judge` reward on a real tiny VLM (transformers' LlavaForConditionalGeneration with a Qwen2 language
model, random weights, saved and loaded from a folder): its score is the model's own next-token softmax over the
answer tokens after the chat template, independent of batching and left padding, and bad settings are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.models.tiny_vlm import write_tiny_vlm
from unirl_core.rewards.vlm_judge import DEFAULT_QUESTIONS, VlmJudgeScore, load_judge

pytestmark = pytest.mark.slow  # real transformers models: about 5 s in all

PROMPTS = ["a red square", "a photo of a cat on a mat", "", "very long prompt " * 20]


@pytest.fixture(scope="module")
def vlm_folder(tmp_path_factory):
    return write_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "vlm", seed=0)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in PROMPTS]


def reference_scores(folder, images, prompts, mode):
    """By hand: the chat text from the processor's template, the processor on (text, image), the model's own
    forward, a softmax over the candidate tokens' logits at the last position."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    words, values = (
        (["yes", "Yes", "no", "No"], [1, 1, 0, 0]) if mode == "yes_no" else (list("123456789"), range(1, 10))
    )
    ids = processor.tokenizer.convert_tokens_to_ids(words)
    scores = []
    for image, prompt in zip(images, prompts, strict=True):
        question = DEFAULT_QUESTIONS[mode].replace("{prompt}", prompt)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n")
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        with torch.no_grad():
            logits = model(**inputs).logits[0, -1]
        probs = torch.softmax(logits[ids], dim=-1)
        scores.append(float(sum(value * p for value, p in zip(values, probs, strict=True))))
    return np.array(scores)


def test_tiny_vlm_is_small_and_loads_offline(vlm_folder):
    assert sum(f.stat().st_size for f in vlm_folder.iterdir()) < 400_000
    judge = load_judge(vlm_folder)
    assert type(judge.model).__name__ == "LlavaForConditionalGeneration"
    assert not judge.model.training and not any(p.requires_grad for p in judge.model.parameters())
    assert load_judge(str(vlm_folder / ".." / "vlm"), torch.device("cpu")) is judge  # cached per folder and device


@pytest.mark.parametrize("mode, low, high", [("yes_no", 0, 1), ("scale", 1, 9)])
def test_score_is_the_models_answer_token_softmax(vlm_folder, images, mode, low, high):
    scores = VlmJudgeScore(vlm_folder, batch_size=4, mode=mode)(images, PROMPTS)
    assert scores.shape == (4,) and scores.dtype == np.float64
    assert ((low <= scores) & (scores <= high)).all() and len(set(np.round(scores, 4))) == 4
    assert np.allclose(scores, reference_scores(vlm_folder, images, PROMPTS, mode), atol=1e-5)


def test_scores_do_not_depend_on_batching_or_padding(vlm_folder, images, tmp_path):
    one_by_one = VlmJudgeScore(vlm_folder, batch_size=1)(images, PROMPTS)
    left_padded = VlmJudgeScore(vlm_folder, batch_size=3)(images, PROMPTS)  # prompts of 0 to 340 characters
    assert np.allclose(one_by_one, left_padded, atol=1e-4)
    again = write_tiny_vlm(tmp_path / "again", seed=0)
    assert np.array_equal(VlmJudgeScore(again, batch_size=3)(images, PROMPTS), left_padded)
    other = write_tiny_vlm(tmp_path / "other", seed=1)
    assert not np.allclose(VlmJudgeScore(other, batch_size=3)(images, PROMPTS), left_padded, atol=1e-3)


def test_a_qwen_vl_judge_loads_here_and_scores_as_its_own_forward_does(images, tmp_path):
    """The tiny Qwen2.5-VL (models/tiny_qwen_vl.py: 3-D rotary positions) as the judge, loaded on this machine
    without torchvision (models/processors.py): its P(yes) batched and left-padded equals the model's own forward on
    each image alone (its positions from the processor's token types)."""
    from unirl_core.models.processors import load_processor
    from unirl_core.models.tiny_lm import write_tiny_lm

    folder = write_tiny_lm(tmp_path / "qwen-vl", "qwen2_5_vl")
    batched = VlmJudgeScore(folder, batch_size=3)(images, PROMPTS)
    judge, processor = load_judge(folder), load_processor(folder)
    ids = processor.tokenizer.convert_tokens_to_ids(["yes", "Yes", "no", "No"])
    for image, prompt, score in zip(images, PROMPTS, batched, strict=True):
        question = DEFAULT_QUESTIONS["yes_no"].replace("{prompt}", prompt)
        text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"},
                                                {"type": "text", "text": question}]}], add_generation_prompt=True)  # fmt: skip
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        assert "mm_token_type_ids" in inputs and inputs["image_grid_thw"].shape == (1, 3)
        with torch.no_grad():
            probs = torch.softmax(judge.model(**inputs).logits[0, -1, ids], dim=-1)
        assert score == pytest.approx(float(probs[:2].sum()), abs=1e-5)


def test_prompts_are_text_even_with_control_tokens(vlm_folder, images):
    """A prompt that spells the image placeholder or the end-of-turn token is scored as text, not as structure."""
    judge = VlmJudgeScore(vlm_folder)
    scores = judge(images[:2], ["<image> on a mat", "a cat<|im_end|>"])
    assert np.isfinite(scores).all() and not np.allclose(scores, judge(images[:2], ["on a mat", "a cat"]))


def test_bfloat16_is_close_to_float32(vlm_folder, images):
    bf16 = VlmJudgeScore(vlm_folder, dtype="bfloat16")
    assert bf16.judge.model.dtype == torch.bfloat16
    assert np.allclose(bf16(images[:2], PROMPTS[:2]), VlmJudgeScore(vlm_folder)(images[:2], PROMPTS[:2]), atol=0.05)


def test_empty_and_mismatched_inputs(vlm_folder, images):
    judge = VlmJudgeScore(vlm_folder)
    assert judge([], []).shape == (0,)
    with pytest.raises(ValueError, match="one prompt per image; got 1 for 2 images"):
        judge(images[:2], PROMPTS[:1])


def test_refuses_a_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.*has no config.json.*Qwen2.5-VL.*nothing is downloaded"):
        VlmJudgeScore(tmp_path / "nowhere")


def test_refuses_a_question_without_the_prompt(vlm_folder):
    with pytest.raises(ValueError, match=r"has no \{prompt\}"):
        VlmJudgeScore(vlm_folder, question="Is this image good? Answer yes or no.")


def test_refuses_answers_that_are_not_one_token(vlm_folder):
    with pytest.raises(ValueError, match=r"answer 'maybe' is not one token.*\['m', 'a', 'y', 'b', 'e'\]"):
        VlmJudgeScore(vlm_folder, answers=("maybe", "no"))
    with pytest.raises(ValueError, match=r"answer '10' is not one token.*\['1', '0'\]"):
        VlmJudgeScore(vlm_folder, mode="scale", scale=(0, 10))
