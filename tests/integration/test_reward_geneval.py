"""The `geneval` reward. Rules first, without any model: the expected numbers are worked by hand from flow_grpo's
GenEval reward (yifan123/reward-server `reward_server/gen_eval.py` @7131478, `evaluate_reward`) and GenEval's
`relative_position` (djghosh13/geneval `evaluation/evaluate_images.py` @16f1681, c = 0.1). Then the tiny OWLv2 +
tiny CLIP (random weights, saved and loaded from folders): deterministic, batch-invariant, the detections
transformers' own OWLv2 path gives, the colours CLIP's own forward gives, and a missing record names its sample."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.rewards.errors import RewardError
from unirl_core.rewards.geneval import (
    COLOR_TEMPLATES,
    COLORS,
    Detection,
    GenEvalScore,
    check_record,
    crop_box,
    fractional_score,
    query_classes,
    record_problem,
    relative_position,
    select_objects,
    strict_score,
)

UNIT = (0, 0, 10, 10)  # a 10 x 10 box at the origin: (x0, y0, x1, y1), y down


def cat(x: float, y: float = 0, score: float = 0.9, colour: str | None = None) -> Detection:
    return Detection("cat", score, (x, y, x + 10, y + 10), colour)


def dog(x: float, y: float = 0, score: float = 0.9, colour: str | None = None) -> Detection:
    return Detection("dog", score, (x, y, x + 10, y + 10), colour)


def scores(detections, record) -> tuple[float, float]:
    checks = check_record(detections, record)
    return strict_score(checks), round(fractional_score(checks), 4)


# ------------------------------------------------------------------------------------------ rules (no model)


def test_relative_position_is_geneval_s_rule():
    # centres (5, 5) and (35, 7): offset (-30, -2) shrinks by 0.1 x (10 + 10) = 2 per axis to (-28, 0); / 30.07
    assert relative_position(UNIT, (30, 2, 40, 12)) == {"left of"}
    assert relative_position((30, 2, 40, 12), UNIT) == {"right of"}
    assert relative_position(UNIT, (2, 30, 12, 40)) == {"above"}  # y grows downwards
    assert relative_position((2, 30, 12, 40), UNIT) == {"below"}
    # diagonal: (-10, -10) -> (-8, -8) / 14.14 = -0.57 on both axes
    assert relative_position(UNIT, (10, 10, 20, 20)) == {"left of", "above"}


def test_relative_position_threshold_c():
    # offset -3 shrinks to -1: -1/3 is no relation; without c it is -3/3 = -1, "left of"
    assert relative_position(UNIT, (3, 0, 13, 10)) == set()
    assert relative_position(UNIT, (3, 0, 13, 10), threshold=0.0) == {"left of"}
    assert relative_position(UNIT, (4, 0, 14, 10)) == set()  # (4 - 2) / 4 = 0.5 exactly: not beyond 0.5
    assert relative_position(UNIT, (5, 0, 15, 10)) == {"left of"}  # (5 - 2) / 5 = 0.6
    assert relative_position(UNIT, (1, 1, 11, 11)) == set()  # both offsets inside c: no relation at all


def test_counting_is_exact_and_credits_the_distance():
    record = {"tag": "counting", "include": [{"class": "cat", "count": 3}], "exclude": [{"class": "cat", "count": 4}]}
    assert scores([cat(0), cat(20), cat(40)], record) == (1.0, 1.0)
    assert scores([cat(0), cat(20)], record) == (0.0, 0.6667)  # 1 - |3 - 2| / 3; exclude credits nothing
    assert scores([cat(x) for x in (0, 20, 40, 60, 80)], record) == (0.0, 0.3333)  # 1 - 2/3, and 5 >= 4
    assert scores([], record) == (0.0, 0.0)
    single = {"tag": "single_object", "include": [{"class": "cat", "count": 1}]}
    assert scores([cat(0), cat(20), cat(40)], single) == (0.0, -1.0)  # 1 - 2/1: reward-server goes negative too
    assert scores([cat(0), dog(20)], single) == (1.0, 1.0)  # other classes do not matter


def test_exclusion_counts_for_strict_only():
    record = {"include": [{"class": "dog", "count": 1}], "exclude": [{"class": "cat", "count": 1}]}
    assert scores([dog(0)], record) == (1.0, 1.0)
    assert scores([dog(0), cat(20)], record) == (0.0, 1.0)
    assert [c.met for c in check_record([dog(0), cat(20)], record)] == [True, False]


def test_two_objects_each_count():
    record = {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]}
    assert scores([cat(0), dog(20)], record) == (1.0, 1.0)
    assert scores([cat(0)], record) == (0.0, 0.5)  # [1, 1 - 1/1]


def test_colour_checks_the_counted_boxes():
    record = {
        "tag": "color_attr",
        "include": [{"class": "cat", "count": 1, "color": "red"}, {"class": "dog", "count": 1, "color": "blue"}],
    }
    assert scores([cat(0, colour="red"), dog(20, colour="blue")], record) == (1.0, 1.0)
    assert scores([cat(0, colour="red"), dog(20, colour="green")], record) == (0.0, 0.75)  # [1, 1, 1, 0]
    assert scores([cat(0, colour="red")], record) == (0.0, 0.5)  # no dog: its colour is a 0 too
    two_red = {"include": [{"class": "cat", "count": 2, "color": "red"}]}
    assert scores([cat(0, colour="red"), cat(20, colour="blue")], two_red) == (0.0, 0.75)  # [1, 1 - |2 - 1|/2]


def test_position_relates_every_box_to_every_target_box():
    record = {
        "tag": "position",
        "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["left of", 0]}],
    }
    assert scores([cat(0), dog(30)], record) == (1.0, 1.0)
    assert scores([cat(30), dog(0)], record) == (0.0, 0.6667)  # [1, 1, 0]; reward-server: [1, 1, 0, 1] = 0.75
    assert scores([cat(0)], record) == (0.0, 0.3333)  # no target: [0, 1, 0]
    assert scores([cat(0), dog(30), dog(60)], record) == (0.0, 0.3333)  # 2 dogs: the target clause failed
    above = {"include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["above", 0]}]}
    assert scores([cat(0, y=0), dog(0, y=30)], above) == (1.0, 1.0)
    assert scores([cat(0, y=0), dog(3, y=0)], above) == (0.0, 0.6667)  # within c: no relation


def test_checks_name_their_requirements():
    record = {
        "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 2, "position": ["right of", 0]}],
        "exclude": [{"class": "cat", "count": 3}],
    }
    assert [c.requirement for c in check_record([], record)] == [
        "1 x dog",
        "2 x cat",
        "cat right of dog",
        "fewer than 3 x cat",
    ]
    assert query_classes(record) == ["dog", "cat"]


def test_select_objects_keeps_confident_boxes_without_duplicates():
    overlapping = [cat(0, score=0.5), cat(1, score=0.8), cat(40, score=0.6), dog(0, score=0.7)]
    kept = select_objects(overlapping)  # cat(0) and cat(1) overlap with IoU 90/110 = 0.82: the 0.8 one stays
    assert sorted((d.label, d.score) for d in kept) == [("cat", 0.6), ("cat", 0.8), ("dog", 0.7)]
    assert len(select_objects(overlapping, nms_iou=1.01)) == 4
    many = [cat(20 * i, score=i / 100) for i in range(20)]
    assert sorted(d.score for d in select_objects(many)) == [i / 100 for i in range(4, 20)]  # the 16 best


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({}, "no non-empty 'include' list"),
        ({"tag": "single_object", "include": []}, "no non-empty 'include' list"),
        ("a cat", "is a str, not an object"),
        ({"include": [{"class": "cat"}]}, r"include\[0\] needs an integer 'count' >= 1, got None"),
        ({"include": [{"class": "cat", "count": 1, "colour": "red"}]}, r"unknown key\(s\) \['colour'\]"),
        ({"include": [{"class": "cat", "count": 1, "color": "teal"}]}, "has color 'teal'"),
        ({"include": [{"class": "cat", "count": 1, "position": ["left of", 0]}]}, "earlier include clause"),
        ({"include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1, "position": ["near", 0]}]}, "near"),
        ({"include": [{"class": "cat", "count": 1}], "exclude": [{"class": "dog"}]}, r"exclude\[0\] needs"),
    ],
)
def test_record_problems_are_named(record, problem):
    found = record_problem(record)
    assert found is not None
    assert re.search(problem, found), found


def test_geneval_s_own_records_are_valid():
    """One record per tag, as GenEval's prompts/create_prompts.py writes them (position as a JSON list)."""
    records = [
        {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"},
        {"tag": "counting", "include": [{"class": "cat", "count": 2}], "exclude": [{"class": "cat", "count": 3}]},
        {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]},
        {
            "tag": "position",
            "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["above", 0]}],
        },
    ]
    assert [record_problem(r) for r in records] == [None] * 4


def test_missing_folders_are_named(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"detector folder .*nowhere.* has no config.json.*owlv2.*nothing is downloaded"
    ):
        GenEvalScore(tmp_path / "nowhere", tmp_path / "clip")


# ------------------------------------------------------------------------------------------ tiny models

RECORDS = [
    {"tag": "single_object", "include": [{"class": "cat", "count": 1}]},
    {"tag": "two_object", "include": [{"class": "cat", "count": 1}, {"class": "dog", "count": 1}]},
    {"tag": "counting", "include": [{"class": "apple", "count": 3}], "exclude": [{"class": "apple", "count": 4}]},
    {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]},
    {
        "tag": "position",
        "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1, "position": ["left of", 0]}],
    },
    {
        "tag": "color_attr",
        "include": [{"class": "bus", "count": 1, "color": "blue"}, {"class": "tie", "count": 1, "color": "green"}],
    },
]
IDS = [f"prompt:{i}:sample:0" for i in range(len(RECORDS))]
THRESHOLD = 0.7  # the tiny detector's random scores lie in 0.3-0.9: this keeps some boxes and drops others


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from unirl_core.models.tiny_clip import write_tiny_clip
    from unirl_core.models.tiny_owl import write_tiny_owl

    root = tmp_path_factory.mktemp("geneval")
    return write_tiny_owl(root / "owl", seed=0), write_tiny_clip(root / "clip", seed=0)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    sizes = [(40, 48), (48, 40), (32, 32), (36, 60), (64, 64), (30, 30)]  # (height, width): OWLv2 pads to square
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


@pytest.fixture(scope="module")
def scorer(folders):
    return GenEvalScore(*folders, batch_size=4, threshold=THRESHOLD)


@pytest.mark.slow
def test_tiny_owl_is_small_and_seeded(folders, tmp_path):
    from safetensors.torch import load_file

    from unirl_core.models.tiny_owl import write_tiny_owl

    owl, _ = folders
    assert sum(f.stat().st_size for f in owl.iterdir()) < 400_000
    weights = load_file(owl / "model.safetensors")
    same = load_file(write_tiny_owl(tmp_path / "same", seed=0) / "model.safetensors")
    other = load_file(write_tiny_owl(tmp_path / "other", seed=1) / "model.safetensors")
    assert all(torch.equal(weights[k], same[k]) for k in weights)
    assert not torch.equal(weights["box_head.dense0.weight"], other["box_head.dense0.weight"])


@pytest.mark.slow
def test_geneval_is_deterministic_and_batch_invariant(folders, scorer, images):
    prompts = ["unused"] * len(images)
    batched = scorer(images, prompts, IDS, metadata=RECORDS)
    assert batched.dtype == np.float64 and batched.shape == (6,) and len(set(batched)) >= 3  # not a constant
    one_by_one = GenEvalScore(*folders, batch_size=1, threshold=THRESHOLD)
    assert np.allclose(one_by_one(images, prompts, IDS, metadata=RECORDS), batched)
    assert scorer.evaluate(images, RECORDS) == one_by_one.evaluate(images, RECORDS)
    assert np.array_equal(scorer(images[::-1], prompts, IDS, metadata=RECORDS[::-1]), batched[::-1])
    strict = GenEvalScore(*folders, threshold=THRESHOLD, scoring="strict")(images, prompts, IDS, metadata=RECORDS)
    expected = [strict_score(checks) for checks in scorer.evaluate(images, RECORDS)]
    assert np.array_equal(strict, expected) and set(strict) <= {0.0, 1.0}
    assert one_by_one.detector is scorer.detector  # loaded once per folder and device


@pytest.mark.slow
def test_detections_equal_transformers_owlv2_path(scorer, images):
    """Per image on its own, as the OWLv2 model card runs it: processor(text=[queries], images=[image]), the model's
    forward, image_processor.post_process_object_detection with the image's (height, width)."""
    classes = [query_classes(record) for record in RECORDS]  # 1 to 2 queries: the batch pads the shorter
    ours = scorer.detector.detect(images, classes, threshold=0.5)
    model, processor = scorer.detector.model, scorer.detector.processor
    for image, names, found in zip(images, classes, ours, strict=True):
        inputs = processor(text=[[f"a photo of a {n}" for n in names]], images=[image], return_tensors="pt")
        with torch.no_grad():
            outputs = model(**inputs)
        (reference,) = processor.image_processor.post_process_object_detection(
            outputs, threshold=0.5, target_sizes=[(image.height, image.width)]
        )
        assert [d.label for d in found] == [names[i] for i in reference["labels"]]
        assert np.allclose([d.score for d in found], reference["scores"].numpy(), atol=1e-5)
        assert np.allclose([d.box for d in found], reference["boxes"].numpy().reshape(-1, 4), atol=1e-3)
    assert sum(map(len, ours)) > 0


@pytest.mark.slow
def test_colours_equal_clip_zero_shot(scorer, images):
    """clip_benchmark's zero_shot_classifier (GenEval's colour classifier) on CLIPModel's own features: per colour
    the renormalized mean of the unit template embeddings; the box crop's colour is the argmax."""
    record = {"include": [{"class": "car", "count": 1, "color": "red"}]}
    found = select_objects(scorer.detector.detect(images[:1], [["car"]], threshold=0.5)[0])
    coloured = scorer._with_colours(images[:1], [found], [record])[0]
    clip = scorer.clip
    texts = [t.format(color=c, object="car") for c in COLORS for t in COLOR_TEMPLATES]
    crops = [crop_box(images[0], d.box) for d in found]
    with torch.no_grad():
        text = clip.model.get_text_features(**clip.processor.tokenizer(texts, padding=True, return_tensors="pt"))
        image = clip.model.get_image_features(**clip.processor.image_processor(images=crops, return_tensors="pt"))
    text, image = (getattr(t, "pooler_output", t) for t in (text, image))
    weights = torch.nn.functional.normalize(text, dim=-1).reshape(len(COLORS), len(COLOR_TEMPLATES), -1).mean(1)
    weights = torch.nn.functional.normalize(weights, dim=-1)
    expected = [COLORS[i] for i in (torch.nn.functional.normalize(image, dim=-1) @ weights.T).argmax(-1)]
    assert found and [d.colour for d in coloured] == expected


@pytest.mark.slow
def test_a_missing_record_names_its_sample(scorer, images):
    records = [*RECORDS[:2], {}, *RECORDS[3:]]
    with pytest.raises(RewardError, match=r"sample 'prompt:2:sample:0'.*no non-empty 'include'.*GenEval record"):
        scorer(images, ["p"] * 6, IDS, metadata=records)
    with pytest.raises(ValueError, match=r"one GenEval record per image.*got none.*prompt:0:sample:0"):
        scorer(images, ["p"] * 6, IDS)
