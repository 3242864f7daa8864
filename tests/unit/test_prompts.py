"""The prompt data layer against the seed's own examples (shared/seeds/unirl-data-preparation.txt)."""

from __future__ import annotations

import json
import logging

import pytest

from unirl_core.data.prompts import MediaRef, PromptDataError, UnsupportedMediaError, load_prompts

SEED_MINIMAL_JSON = [
    {"prompt": "A watercolor landscape with snowy mountains at sunrise."},
    {"prompt": "A cinematic portrait of a robot reading under warm light."},
]
SEED_TXT = "A drone shot flying over a misty pine forest at dawn.\nTime-lapse of clouds rolling over a desert canyon.\n"
SEED_CONDITION = {
    "prompt": "Animate this scene with gentle falling snow.",
    "media_refs": [{"modality": "image", "role": "condition", "uri": "frames/scene_01.png"}],
}


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return str(path)


def test_seed_minimal_json(tmp_path):
    examples = load_prompts(write(tmp_path, "prompts.json", SEED_MINIMAL_JSON))
    assert [e.prompt for e in examples] == [r["prompt"] for r in SEED_MINIMAL_JSON]
    assert [e.prompt_id for e in examples] == ["prompts.json:0", "prompts.json:1"]
    assert all(e.metadata == {} and e.media_refs == () for e in examples)


def test_seed_txt_one_prompt_per_non_empty_line(tmp_path):
    path = write(tmp_path, "train.txt", "\n" + SEED_TXT.replace("\n", "\n   \n", 1) + "\n\n")
    examples = load_prompts(path)
    assert [e.prompt for e in examples] == SEED_TXT.strip().split("\n")
    assert [e.prompt_id for e in examples] == ["train.txt:0", "train.txt:1"]


def test_seed_condition_ref_resolves_against_the_file_folder(tmp_path):
    (tmp_path / "data").mkdir()
    path = write(tmp_path / "data", "edit.json", [SEED_CONDITION])
    (example,) = load_prompts(path)
    assert example.media_refs == (MediaRef("image", "condition", str(tmp_path / "data" / "frames" / "scene_01.png")),)
    assert example.to_dict()["media_refs"][0]["uri"].startswith(str(tmp_path))


@pytest.mark.parametrize(
    "uri",
    ["/abs/frames/a.png", "http://x.org/a.png", "https://x.org/a.png", "s3://bucket/a.png", "gs://b/a.png"],
)
def test_absolute_and_remote_uris_pass_through(tmp_path, uri):
    record = {"prompt": "p", "media": [{"modality": "image", "role": "condition", "uri": uri}]}
    (example,) = load_prompts(write(tmp_path, "p.jsonl", json.dumps(record)))
    assert example.media_refs[0].uri == uri


def test_relative_uri_with_parent_segments_is_normalized(tmp_path):
    record = {
        "prompt": "p",
        "media_refs": [{"modality": "IMAGE", "role": " condition ", "uri": "../img/a.png"}],
    }
    (tmp_path / "sub").mkdir()
    (example,) = load_prompts(write(tmp_path / "sub", "p.json", [record]))
    assert example.media_refs == (MediaRef("image", "condition", str(tmp_path / "img" / "a.png")),)


def test_jsonl_and_json_shapes(tmp_path):
    jsonl = write(tmp_path, "a.jsonl", '{"prompt": "one"}\n\n{"caption": "two"}\n"three"\n')
    assert [e.prompt for e in load_prompts(jsonl)] == ["one", "two", "three"]
    strings = write(tmp_path, "b.json", ["x", "y"])
    assert [e.prompt for e in load_prompts(strings)] == ["x", "y"]
    wrapped = write(tmp_path, "c.json", {"prompts": ["x", {"prompt": "y", "prompt_id": 7}]})
    assert [(e.prompt, e.prompt_id) for e in load_prompts(wrapped)] == [("x", "c.json:0"), ("y", "7")]
    single_caption = write(tmp_path, "d.json", {"caption": "only one", "source": "web"})
    (example,) = load_prompts(single_caption)
    assert (example.prompt, example.metadata) == ("only one", {"source": "web"})


def test_configurable_prompt_key(tmp_path):
    rows = write(tmp_path, "t.json", [{"text": "a cat", "style": "ink"}, {"caption": "a dog"}])
    examples = load_prompts(rows, prompt_key="text")
    assert [(e.prompt, e.metadata) for e in examples] == [("a cat", {"style": "ink"}), ("a dog", {})]
    keyed_list = write(tmp_path, "u.json", {"text": ["first", "second"]})
    assert [e.prompt for e in load_prompts(keyed_list, prompt_key="text")] == ["first", "second"]
    single = write(tmp_path, "v.json", {"text": "solo"})
    assert [e.prompt for e in load_prompts(single, prompt_key="text")] == ["solo"]


def test_metadata_folding_follows_the_seed(tmp_path, caplog):
    rows = [
        {"prompt": "folded", "style": "ink", "score": 3},
        {"prompt": "explicit", "metadata": {"style": "oil"}, "stray": 1},
    ]
    with caplog.at_level(logging.WARNING):
        folded, explicit = load_prompts(write(tmp_path, "m.json", rows))
    assert folded.metadata == {"style": "ink", "score": 3}
    assert explicit.metadata == {"style": "oil"}  # used as is: 'stray' is not folded in
    assert "stray" in caplog.text and "ignored" in caplog.text


@pytest.mark.parametrize(
    "field",
    ["prompt_embed_path", "prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds", "t5_embeds"],
)
def test_legacy_embedding_fields_are_refused(tmp_path, field):
    path = write(tmp_path, "e.jsonl", '{"prompt": "ok"}\n' + json.dumps({"prompt": "p", field: "x.pt"}))
    with pytest.raises(PromptDataError, match=rf"e\.jsonl, line 2: .*{field}.*computed at runtime"):
        load_prompts(path)


@pytest.mark.parametrize(
    "field", ["negative_prompt", "seed", "guidance_scale", "height", "width", "num_inference_steps"]
)
def test_sampling_fields_in_rows_point_at_train_sampling(tmp_path, field):
    path = write(tmp_path, "s.json", [{"prompt": "ok"}, {"prompt": "p", field: 1}])
    with pytest.raises(PromptDataError, match=rf"s\.json, item 1: .*train\.sampling\.{field}"):
        load_prompts(path)


@pytest.mark.parametrize(
    "refs",
    [
        [{"modality": "video", "role": "condition", "uri": "a.mp4"}],
        [{"modality": "image", "role": "target", "uri": "a.png"}],
        [{"modality": "image", "role": "condition", "uri": "a.png"}] * 2,
    ],
)
def test_unsupported_media_is_not_implemented_at_load_time(tmp_path, refs):
    path = write(
        tmp_path,
        "c.jsonl",
        '{"prompt": "ok"}\n{"prompt": "ok"}\n' + json.dumps({"prompt": "p", "media_refs": refs}),
    )
    with pytest.raises(UnsupportedMediaError, match=r"c\.jsonl, line 3: .*modality='image', role='condition'") as info:
        load_prompts(path)
    assert isinstance(info.value, NotImplementedError)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": ""}', r"line 1: needs a non-empty 'prompt'"),
        ('{"caption": "  "}', r"line 1: needs a non-empty 'prompt'"),
        ('{"style": "ink"}', r"line 1: needs a non-empty 'prompt'"),
        ('{"prompt": "a"}\n{"prompt": "b",}', r"line 2: not valid JSON"),
        ("[1, 2]", r"line 1: expected a JSON object or a string, got list"),
        ('{"prompt": "a", "metadata": [1]}', r"line 1: 'metadata' must be an object"),
        ('{"prompt": "a", "media": "x.png"}', r"line 1: 'media' must be a list"),
        ('{"prompt": "a", "media": [], "media_refs": []}', r"line 1: both 'media' and 'media_refs'"),
        ('{"prompt": "a", "media": [{"modality": "image", "role": "condition"}]}', r"missing \['uri'\]"),
        (
            '{"prompt": "a", "media": [{"modality": "image", "role": "condition", "uri": "x", "w": 1}]}',
            r"extra \['w'\]",
        ),
        (
            '{"prompt": "a", "media": [{"modality": "image", "role": "condition", "uri": "file:///x"}]}',
            "scheme",
        ),
        ("\n\n", "no prompts found"),
    ],
)
def test_bad_rows_name_the_file_and_line(tmp_path, content, message):
    path = write(tmp_path, "bad.jsonl", content)
    with pytest.raises(PromptDataError, match=message) as info:
        load_prompts(path)
    assert str(info.value).startswith(path)


def test_bad_json_documents(tmp_path):
    with pytest.raises(PromptDataError, match=r"x\.json: not valid JSON .* line 1"):
        load_prompts(write(tmp_path, "x.json", "[{"))
    with pytest.raises(PromptDataError, match=r"y\.json: expected a list .* keys \['items'\]"):
        load_prompts(write(tmp_path, "y.json", {"items": []}))
    with pytest.raises(PromptDataError, match=r"z\.json, prompts\[1\]: needs a non-empty"):
        load_prompts(write(tmp_path, "z.json", {"prompts": ["ok", {"prompt": None}]}))


def test_unsupported_extension_and_missing_file(tmp_path):
    with pytest.raises(
        PromptDataError, match=r"p\.csv: unsupported prompt file extension; use one of \.txt, \.jsonl, \.json"
    ):
        load_prompts(write(tmp_path, "p.csv", "a,b"))
    with pytest.raises(PromptDataError, match="no such prompt file"):
        load_prompts(str(tmp_path / "absent.txt"))
    with pytest.raises(PromptDataError, match="not UTF-8"):
        (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
        load_prompts(str(tmp_path / "latin.txt"))


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("bom.txt", "first\nsecond\n"),
        ("bom.jsonl", '{"prompt": "first"}\n{"prompt": "second"}\n'),
        ("bom.json", '["first", "second"]'),
    ],
)
def test_byte_order_mark_and_crlf_are_not_part_of_prompts(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + content.replace("\n", "\r\n").encode())
    assert [e.prompt for e in load_prompts(str(path))] == ["first", "second"]


def test_prompt_ids_are_checked_and_unique(tmp_path):
    ok = write(tmp_path, "ids.json", [{"prompt": "a", "prompt_id": 3}, {"prompt": "b", "prompt_id": "x"}, "c"])
    assert [e.prompt_id for e in load_prompts(ok)] == ["3", "x", "ids.json:2"]
    for bad in (True, "", {"a": 1}, 1.5):
        with pytest.raises(PromptDataError, match=r"item 0: 'prompt_id' must be a non-empty string or an integer"):
            load_prompts(write(tmp_path, "bad_id.json", [{"prompt": "a", "prompt_id": bad}]))
    dup = write(tmp_path, "dup.json", [{"prompt": "a", "prompt_id": "x"}, "b", {"prompt": "c", "prompt_id": "x"}])
    with pytest.raises(PromptDataError, match=r"dup\.json: prompt_id 'x' is used by records 0 and 2"):
        load_prompts(dup)


def test_a_folder_or_unknown_protocol_is_a_clean_error(tmp_path):
    (tmp_path / "d.json").mkdir()
    with pytest.raises(PromptDataError, match=r"d\.json: cannot read the prompt file"):
        load_prompts(str(tmp_path / "d.json"))
    with pytest.raises(PromptDataError, match="cannot open .*Protocol not known"):
        load_prompts("nosuch://bucket/p.txt")
    with pytest.raises(PromptDataError, match=r"'prompts' must be a list, got str"):
        load_prompts(write(tmp_path, "p.json", {"prompts": "not a list"}))


def test_user_keys_that_merely_mention_embedding_fold_into_metadata(tmp_path):
    (example,) = load_prompts(write(tmp_path, "m.json", [{"prompt": "a", "style_embedding": "clip"}]))
    assert example.metadata == {"style_embedding": "clip"}


def test_every_bad_record_of_a_file_is_in_one_report(tmp_path):
    """One run names every bad line (up to REPORTED, the count whole), so one edit fixes the file."""
    from unirl_core.data.prompts import REPORTED

    lines = ['{"prompt": "ok"}', "{not json", '{"prompt": ""}', '{"prompt": "fine"}', '{"caption": 3}']
    path = write(tmp_path, "many.jsonl", "\n".join(lines))
    with pytest.raises(PromptDataError) as info:
        load_prompts(path)
    report = str(info.value).splitlines()
    assert report[0] == f"{path}: 3 bad records:"
    assert [line.split(": ", 1)[0].strip() for line in report[1:]] == [f"{path}, line {n}" for n in (2, 3, 5)]
    assert "not valid JSON" in report[1] and "non-empty 'prompt'" in report[2]
    path = write(tmp_path, "worse.jsonl", "\n".join(['{"prompt": ""}'] * (REPORTED + 5)))
    with pytest.raises(PromptDataError, match=rf"{REPORTED + 5} bad records") as info:
        load_prompts(path)
    assert len(str(info.value).splitlines()) == 1 + REPORTED + 1 and str(info.value).endswith("... and 5 more")
