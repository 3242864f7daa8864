"""The `ocr` reward: flow_grpo's text-accuracy formula (fast, no model), then `OcrScore` on a real tiny TrOCR-style
model (transformers' VisionEncoderDecoderModel, random weights, saved and loaded from a folder).

The formula's expected values are worked by hand from flow_grpo's `OcrScorer.__call__` (flow_grpo/ocr.py, read at
zhtmike/flow_grpo@def7b8403e9659aba03ba8d82bbd69a33fc58d00, a verbatim fork of yifan123/flow_grpo):
target = prompt.split('"')[1]; both texts .replace(" ", "").lower(); dist = 0 if target in recognized else
Levenshtein.distance(recognized, target); dist = min(dist, len(target)); reward = 1 - dist / len(target).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.rewards.ocr import OcrScore, load_ocr, ocr_reward, target_text

slow = pytest.mark.slow  # the tests below that build, save and run a real tiny model

FORMULA_CASES = [
    # (recognized, prompt, expected)
    ("Hello World", 'a sign that says "Hello World"', 1.0),  # exact
    ("OPEN 24 HOURS", 'a neon sign reading "24 hours"', 1.0),  # target inside a longer reading: no penalty
    ("helloworld", 'a sign "Hello  World"', 1.0),  # spaces and case ignored
    ("H E L L O", 'a mug with "hello" on it', 1.0),
    ("Helo World", 'a sign that says "Hello World"', 0.9),  # one deletion out of 10 letters
    ("cat", 'a cup that says "cab"', 1 - 1 / 3),  # one substitution
    ("stoop", 'a red "STOP" sign', 0.75),  # one insertion; "stop" is not a substring of "stoop"
    ("hellp world!!", 'a poster "hello world"', 0.7),  # 1 substitution + 2 deletions over 10
    ("x" * 20, 'a sign "abc"', 0.0),  # 20 edits, capped at len(target) = 3
    ("", 'a sign that says "Hi"', 0.0),  # nothing read
    ("hello\tworld", 'a sign "hello world"', 0.9),  # only " " is removed: the tab costs one deletion
    ("B", 'two signs, "A" and "B"', 0.0),  # the first quoted text is the target
    ("hello", 'a sign that says "hello', 1.0),  # one quote: the text after it
]


@pytest.mark.parametrize(("recognized", "prompt", "expected"), FORMULA_CASES)
def test_ocr_reward_is_flow_grpo_formula(recognized, prompt, expected):
    assert ocr_reward(recognized, prompt) == pytest.approx(expected, abs=1e-12)


def test_target_text_is_the_first_quoted_text():
    assert target_text('New York Skyline with "Hello World" written with fireworks') == "Hello World"
    assert target_text('"A" then "B"') == "A"


@pytest.mark.parametrize("prompt", ["a plain prompt, nothing quoted", 'an empty sign ""', 'a blank sign "  "'])
def test_prompt_without_quoted_text_is_refused(prompt):
    """flow_grpo crashes on these (IndexError, ZeroDivisionError); we name the prompt."""
    with pytest.raises(ValueError, match="ocr .*" + prompt[:8]):
        ocr_reward("anything", prompt)


def test_ocr_names_a_missing_folder(tmp_path):
    with pytest.raises(
        FileNotFoundError, match="nowhere.*has no config.json.*trocr-base-printed.*nothing is downloaded"
    ):
        OcrScore(tmp_path / "nowhere")


@pytest.fixture(scope="module")
def ocr_folder(tmp_path_factory):
    from unirl_core.models.tiny_ocr import write_tiny_ocr

    return write_tiny_ocr(tmp_path_factory.mktemp("tiny-ocr") / "ocr", seed=0)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    noise = [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(4)]
    return [*noise, Image.new("RGB", (50, 30), "white"), Image.new("L", (30, 50), 0)]  # gray is read as RGB


def reference_texts(folder, images) -> list[str]:
    """What transformers itself reads: the folder's processor and model, generate with its generation config."""
    from transformers import AutoProcessor, VisionEncoderDecoderModel

    processor = AutoProcessor.from_pretrained(folder)
    model = VisionEncoderDecoderModel.from_pretrained(folder).eval()
    pixels = processor(images=[image.convert("RGB") for image in images], return_tensors="pt").pixel_values
    with torch.no_grad():
        return processor.batch_decode(model.generate(pixels, max_new_tokens=32), skip_special_tokens=True)


@slow
def test_tiny_ocr_is_small_and_loads_offline(ocr_folder):
    assert sum(f.stat().st_size for f in ocr_folder.iterdir()) < 200_000
    ocr = load_ocr(ocr_folder)
    assert type(ocr.model).__name__ == "VisionEncoderDecoderModel"
    assert ocr.processor.tokenizer.decode(
        ocr.processor.tokenizer("Hello World!").input_ids, skip_special_tokens=True
    ) == ("Hello World!")


@slow
def test_ocr_scores_what_the_model_reads(ocr_folder, images):
    texts = reference_texts(ocr_folder, images)
    assert all(texts) and len(set(texts)) == len(texts)  # the random reader does read, differently per image
    piece = max(texts[0].split('"'), key=len)[:8]  # a quote-free part of what image 0 reads
    prompts = [f'a sign that says "{piece}"', 'a poster "a completely different sentence"']
    prompts += [f'a shop sign "{word}"' for word in ("Open", "Bakery", "Fresh Bread", "EXIT")]
    scorer = OcrScore(ocr_folder, batch_size=4, max_new_tokens=32)
    scores = scorer(images, prompts)
    assert scorer.last_texts == texts == scorer.recognize(images)
    assert scores.dtype == np.float64 and scores.shape == (6,)
    assert np.array_equal(scores, [ocr_reward(text, prompt) for text, prompt in zip(texts, prompts, strict=True)])
    assert scores[0] == 1.0 and scores[1] < 1.0 and ((scores >= 0) & (scores <= 1)).all()


@slow
def test_ocr_is_deterministic_and_batch_invariant(ocr_folder, images, tmp_path):
    from unirl_core.models.tiny_ocr import write_tiny_ocr

    prompts = ['a sign "Hello World"'] * len(images)
    batched = OcrScore(ocr_folder, batch_size=4)
    scores = batched(images, prompts)
    one_by_one = OcrScore(ocr_folder, batch_size=1)
    assert np.array_equal(one_by_one(images, prompts), scores) and one_by_one.last_texts == batched.last_texts
    assert OcrScore(write_tiny_ocr(tmp_path / "again", seed=0)).recognize(images) == batched.last_texts
    assert OcrScore(write_tiny_ocr(tmp_path / "other", seed=1)).recognize(images) != batched.last_texts


@slow
def test_ocr_loads_once_per_folder_and_device(ocr_folder):
    first = OcrScore(ocr_folder)
    second = OcrScore(str(ocr_folder / ".." / ocr_folder.name), device=torch.device("cpu"), batch_size=1)
    assert first.ocr is second.ocr
    model = first.ocr.model
    assert not model.training and model.dtype == torch.float32
    assert not any(p.requires_grad for p in model.parameters())


@slow
def test_ocr_checks_its_inputs(ocr_folder, images):
    scorer = OcrScore(ocr_folder)
    empty = scorer([], [])
    assert empty.shape == (0,) and empty.dtype == np.float64
    with pytest.raises(ValueError, match="one prompt per image; got 1 for 2 images"):
        scorer(images[:2], ['"a"'])
    with pytest.raises(ValueError, match="double quotes"):
        scorer(images[:2], ['"a"', "no quotes here"])


@slow
def test_ocr_refuses_a_folder_of_another_model(tmp_path):
    from unirl_core.models.tiny_clip import write_tiny_clip
    from unirl_core.models.tiny_ocr import build_tiny_ocr

    with pytest.raises(ValueError, match="holds model_type 'clip'.*VisionEncoderDecoderModel"):
        OcrScore(write_tiny_clip(tmp_path / "clip"))
    build_tiny_ocr()[0].save_pretrained(tmp_path / "no-processor")
    with pytest.raises(FileNotFoundError, match="no-processor.*has no \\(pre\\)processor_config.json"):
        OcrScore(tmp_path / "no-processor")
