"""The packaged benchmark prompt sets: GenEval's six tasks by its rules (records the `geneval` reward accepts), OCR
prompts whose quoted text the `ocr` reward reads, and general prompts; each written once into the workspace, the
same bytes every time, and found by name by `unirl eval --prompts`."""

from __future__ import annotations

import collections
from pathlib import Path

from unirl_core.data.prompts import load_prompts
from unirl_core.evaluation import prompt_sets
from unirl_core.rewards.geneval import record_problem


def test_geneval_follows_genevals_rules_and_every_record_is_one_the_reward_reads():
    records = prompt_sets.geneval_records(per_task=20)
    tags = collections.Counter(r["tag"] for r in records)
    assert tags["single_object"] == 80  # every COCO class alone
    assert set(tags) == {"single_object", "two_object", "counting", "colors", "position", "color_attr"}
    assert all(15 <= tags[t] <= 20 for t in tags if t != "single_object")  # 20 drawn, duplicates dropped
    assert all(record_problem(r) is None for r in records)
    assert len({r["prompt"] for r in records}) == len(records)
    for r in records:
        if r["tag"] == "counting":
            (include,), (exclude,) = r["include"], r["exclude"]
            assert exclude == {"class": include["class"], "count": include["count"] + 1}
            assert r["prompt"].split()[3] == prompt_sets.NUMBERS[include["count"]]
        if r["tag"] in ("colors", "color_attr"):
            assert all(c["class"] != "person" and c["color"] in r["prompt"] for c in r["include"])
        if r["tag"] == "position":
            target, placed = r["include"]
            assert r["prompt"] == f"a photo of {prompt_sets._article(placed['class'])} {placed['position'][0]} " \
                                  f"{prompt_sets._article(target['class'])}"  # fmt: skip
    assert prompt_sets.geneval_records(per_task=20) == records  # seeded


def test_sets_are_files_in_the_workspace_with_the_records_each_reward_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIRL_HOME", str(tmp_path))
    for name in prompt_sets.SETS:
        path = prompt_sets.prompt_file(name)
        before = (tmp_path / "prompt_sets" / f"{name}.jsonl").read_bytes()
        assert prompt_sets.prompt_file(name) == path and Path(path).read_bytes() == before
        examples = load_prompts(path)
        assert len(examples) >= 30
    ocr = load_prompts(prompt_sets.prompt_file("ocr"))
    assert all(e.prompt.split('"')[1] == e.metadata["text"] for e in ocr)  # the text the ocr reward reads
    geneval = load_prompts(prompt_sets.prompt_file("geneval"))
    assert all(record_problem(e.metadata) is None for e in geneval)  # the record reaches the reward as metadata


def test_the_published_files_load_as_they_are_with_the_record_each_reward_reads(tmp_path):
    """GenEval's `prompts/evaluation_metadata.jsonl` (flow_grpo's `dataset/geneval/test_metadata.jsonl` has the same
    lines) and flow_grpo's `dataset/ocr/test.txt` (a prompt per line, the text in double quotes): lines in their
    published shape load as prompt files; each GenEval line's record reaches the reward as the prompt's metadata."""
    import json

    from unirl_core.rewards.ocr import target_text

    geneval = [
        {"tag": "single_object", "include": [{"class": "bench", "count": 1}], "prompt": "a photo of a bench"},
        {"tag": "counting", "include": [{"class": "clock", "count": 2}], "exclude": [{"class": "clock", "count": 3}],
         "prompt": "a photo of two clocks"},
        {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "blue"}], "prompt": "a photo of a blue car"},
        {"tag": "position", "include": [{"class": "cow", "count": 1}, {"class": "train", "count": 1,
         "position": ["right of", 0]}], "prompt": "a photo of a train right of a cow"},
    ]  # fmt: skip
    metadata = tmp_path / "evaluation_metadata.jsonl"
    metadata.write_text("".join(json.dumps(line) + "\n" for line in geneval))
    examples = load_prompts(str(metadata))
    assert [e.prompt for e in examples] == [line["prompt"] for line in geneval]
    assert [e.metadata for e in examples] == [{k: v for k, v in line.items() if k != "prompt"} for line in geneval]
    assert all(record_problem(e.metadata) is None for e in examples)

    ocr = tmp_path / "test.txt"
    ocr.write_text('New York Skyline with "Hello World" written with fireworks on the sky\nA sign that says "OPEN"\n')
    assert [target_text(e.prompt) for e in load_prompts(str(ocr))] == ["Hello World", "OPEN"]
