"""Prompt sources (batches, epochs, exact resume) and rollout groups."""

from __future__ import annotations

import pytest

from unirl_core.config import DataConfig
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.prompts import PromptExample, load_prompts
from unirl_core.data.sources import (
    SMOKE_PROMPTS,
    FilePromptSource,
    SmokePromptSource,
    build_source,
    load_eval_prompts,
)


@pytest.fixture
def ten_prompts(tmp_path):
    path = tmp_path / "ten.txt"
    path.write_text("".join(f"prompt number {i}\n" for i in range(10)))
    return str(path)


def ids(batch):
    return [e.prompt_id for e in batch]


def test_file_source_batches_epochs_and_drops_the_partial_batch(ten_prompts):
    source = FilePromptSource(ten_prompts, prompts_per_rollout=4, seed=3)
    assert source.batches_per_epoch == 2
    epoch0 = [source.next_batch() for _ in range(2)]
    epoch1 = [source.next_batch() for _ in range(2)]
    assert source.epoch == 1
    for epoch in (epoch0, epoch1):
        seen = [pid for batch in epoch for pid in ids(batch)]
        assert len(seen) == len(set(seen)) == 8  # 10 prompts, batches of 4: 2 prompts dropped per epoch
    assert ids(epoch0[0]) != ids(epoch1[0])  # reshuffled each epoch
    again = FilePromptSource(ten_prompts, prompts_per_rollout=4, seed=3)
    assert [ids(again.next_batch()) for _ in range(4)] == [ids(b) for b in epoch0 + epoch1]
    other_seed = FilePromptSource(ten_prompts, prompts_per_rollout=4, seed=4)
    assert ids(other_seed.next_batch()) != ids(epoch0[0])


def test_file_source_without_shuffle_keeps_file_order(ten_prompts):
    source = FilePromptSource(ten_prompts, prompts_per_rollout=3, shuffle=False)
    assert [ids(source.next_batch()) for _ in range(4)] == [
        ["ten.txt:0", "ten.txt:1", "ten.txt:2"],
        ["ten.txt:3", "ten.txt:4", "ten.txt:5"],
        ["ten.txt:6", "ten.txt:7", "ten.txt:8"],
        ["ten.txt:0", "ten.txt:1", "ten.txt:2"],  # ten.txt:9 is the dropped partial batch
    ]


def test_file_source_resumes_exactly(ten_prompts):
    uninterrupted = FilePromptSource(ten_prompts, prompts_per_rollout=4, seed=1)
    expected = [ids(uninterrupted.next_batch()) for _ in range(9)]
    first = FilePromptSource(ten_prompts, prompts_per_rollout=4, seed=1)
    for _ in range(5):
        first.next_batch()
    state = first.state_dict()
    resumed = FilePromptSource(ten_prompts, prompts_per_rollout=4, seed=1)
    resumed.load_state_dict(state)
    assert [ids(resumed.next_batch()) for _ in range(4)] == expected[5:]


def test_file_source_refuses_a_changed_file_on_resume(ten_prompts, tmp_path):
    state = FilePromptSource(ten_prompts, prompts_per_rollout=4).state_dict()
    with open(ten_prompts, "a") as f:
        f.write("one more\n")
    with pytest.raises(ValueError, match=r"changed since this state was saved \(num_prompts: 10 then, 11 now"):
        FilePromptSource(ten_prompts, prompts_per_rollout=4).load_state_dict(state)


@pytest.mark.parametrize(
    ("change", "field"),
    [({"prompts_per_rollout": 2}, "prompts_per_rollout"), ({"seed": 9}, "seed"), ({"shuffle": False}, "shuffle")],
)
def test_file_source_refuses_other_settings_on_resume(ten_prompts, change, field):
    source = FilePromptSource(ten_prompts, prompts_per_rollout=4, seed=0)
    for _ in range(3):
        source.next_batch()
    settings = {"prompts_per_rollout": 4, "seed": 0, "shuffle": True, **change}
    other = FilePromptSource(ten_prompts, prompts_per_rollout=settings.pop("prompts_per_rollout"), **settings)
    with pytest.raises(ValueError, match=rf"{field}: "):
        other.load_state_dict(source.state_dict())


def test_file_source_needs_enough_prompts(ten_prompts):
    with pytest.raises(ValueError, match=r"has 10 prompts, fewer than train.data.prompts_per_rollout=16"):
        FilePromptSource(ten_prompts, prompts_per_rollout=16)


def test_smoke_source_ignores_data_path_and_cycles_its_prompts(caplog):
    source = SmokePromptSource("/not/read.json", prompts_per_rollout=3, shuffle=False)
    assert "ignores train.data.data_path=/not/read.json" in caplog.text
    batches = [source.next_batch() for _ in range(3)]
    assert [e.prompt for e in batches[0]] == list(SMOKE_PROMPTS[:3])
    assert [e.prompt for e in batches[2]] == list(SMOKE_PROMPTS[:3])  # 8 prompts, batches of 3: 2 per epoch
    shuffled = SmokePromptSource(prompts_per_rollout=4, seed=5)
    for _ in range(3):
        shuffled.next_batch()
    resumed = SmokePromptSource(prompts_per_rollout=4, seed=5)
    resumed.load_state_dict(shuffled.state_dict())
    assert ids(resumed.next_batch()) == ids(shuffled.next_batch())
    with pytest.raises(ValueError, match=r"fewer than train.data.prompts_per_rollout=20"):
        SmokePromptSource(prompts_per_rollout=20)


def test_a_state_of_another_source_kind_is_refused(ten_prompts):
    state = FilePromptSource(ten_prompts, prompts_per_rollout=4).state_dict()
    with pytest.raises(ValueError, match=r"source: 'file' then, 'smoke' now"):
        SmokePromptSource(prompts_per_rollout=4).load_state_dict(state)


def test_build_source_by_key_and_by_class_path(ten_prompts):
    by_key = build_source(DataConfig(source="file", data_path=ten_prompts, prompts_per_rollout=2))
    assert isinstance(by_key, FilePromptSource)
    by_path = build_source(DataConfig(source="unirl_core.data.sources.SmokePromptSource", prompts_per_rollout=2))
    assert isinstance(by_path, SmokePromptSource)
    with pytest.raises(ValueError, match="importing it failed"):
        build_source(DataConfig(source="nowhere.Source"))


def test_eval_prompts_keep_file_order(ten_prompts):
    config = DataConfig(source="smoke", eval_data_path=ten_prompts)
    assert ids(load_eval_prompts(config)) == [f"ten.txt:{i}" for i in range(10)]
    assert load_eval_prompts(DataConfig(source="smoke")) == []


def test_groups_repeat_each_prompt_late_with_adjacent_siblings():
    batch = [PromptExample("a", "f:0"), PromptExample("b", "f:1")]
    samples = expand_groups(batch, samples_per_prompt=3, first_group_id=10)
    assert [s.sample_id for s in samples] == [
        "prompt:10:sample:0",
        "prompt:10:sample:1",
        "prompt:10:sample:2",
        "prompt:11:sample:0",
        "prompt:11:sample:1",
        "prompt:11:sample:2",
    ]
    assert [s.example.prompt for s in samples] == ["a", "a", "a", "b", "b", "b"]
    assert samples[4].to_dict() == {
        "prompt": "b",
        "prompt_id": "f:1",
        "metadata": {},
        "media_refs": [],
        "group_id": 11,
        "sample_id": "prompt:11:sample:1",
    }
    with pytest.raises(ValueError):
        expand_groups(batch, samples_per_prompt=0)


def test_a_prompt_file_is_parsed_once_per_process_until_it_changes(tmp_path, monkeypatch):
    """Validation, the inputs log and each round's controller build a source before the first step: one parse."""
    import os

    import unirl_core.data.sources as sources

    path = tmp_path / "once.txt"
    path.write_text("".join(f"prompt {i}\n" for i in range(6)))
    parsed = []
    monkeypatch.setattr(sources, "load_prompts", lambda *a, **k: parsed.append(a) or load_prompts(*a, **k))
    for _ in range(5):
        assert len(FilePromptSource(str(path), prompts_per_rollout=2).prompts) == 6
    assert len(parsed) == 1
    path.write_text("".join(f"other {i}\n" for i in range(7)))  # a new version: parsed again
    os.utime(path, ns=(1, 1))
    assert [p.prompt for p in FilePromptSource(str(path), prompts_per_rollout=2, shuffle=False).prompts][0] == "other 0"
    assert len(parsed) == 2


def test_the_counting_source_draws_pictures_with_as_many_dots_as_its_answer_once(tmp_path, monkeypatch):
    """The VLM demo's prompts: each picture (a condition image in the workspace) shows as many separate dots as its
    metadata answer says; a second source reuses the files (mtimes kept)."""
    import numpy as np
    from PIL import Image
    from scipy import ndimage

    from unirl_core.data.sources import CountingPromptSource

    monkeypatch.setenv("UNIRL_HOME", str(tmp_path))
    examples = CountingPromptSource.examples()
    assert len(examples) == 16 and {e.metadata["answer"] for e in examples} == {"1", "2", "3", "4"}
    for example in examples:
        (ref,) = example.media_refs
        assert (ref.modality, ref.role) == ("image", "condition")
        dark = np.asarray(Image.open(ref.uri).convert("L")) < 128
        assert ndimage.label(dark)[1] == int(example.metadata["answer"]), ref.uri
    assert len({np.asarray(Image.open(e.media_refs[0].uri)).tobytes() for e in examples}) == 16  # 16 layouts
    mtimes = [tmp_path.joinpath(e.media_refs[0].uri).stat().st_mtime_ns for e in examples]
    CountingPromptSource.examples()
    assert [tmp_path.joinpath(e.media_refs[0].uri).stat().st_mtime_ns for e in examples] == mtimes
