"""`unirl rewards`: the list names every reward a recipe accepts; `score` scores your own images (a weight-free and
a model reward on a tiny CLIP, the same numbers as the reward service); `check` loads a recipe's rewards and times
them; bad input exits 2 with one line."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.rewards.functions import jpeg_compressibility
from unirl_core.rewards.names import builtin_names

runner = CliRunner()


@pytest.fixture
def pictures(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i, size in enumerate((16, 24)):
        path = tmp_path / f"image{i}.png"
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def test_list_names_every_builtin_reward():
    result = runner.invoke(app, ["rewards", "list"])
    assert result.exit_code == 0
    listed = {line.split()[0] for line in result.stdout.splitlines()[1:]}
    assert listed == builtin_names() | {"<any"}


def test_score_prints_each_images_scores(pictures):
    result = runner.invoke(app, ["rewards", "score", *map(str, pictures), "-r", "jpeg_compressibility",
                                 "-r", "brightness", "--prompt", "a cat"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    expected = jpeg_compressibility([Image.open(p) for p in pictures])
    assert [float(row[-2]) for row in rows] == pytest.approx(expected, abs=1e-4)
    assert rows[0][0] == str(pictures[0]) and rows[0][1:3] == ["a", "cat"]


@pytest.mark.slow
def test_score_and_check_load_a_model_reward(pictures, tmp_path):
    from unirl_core.models.tiny_clip import write_tiny_clip

    clip = write_tiny_clip(tmp_path / "clip")
    model = ["--set", f"train.reward.clip.model_path={clip}"]
    result = runner.invoke(app, ["rewards", "score", *map(str, pictures), "-r", "clip_score", "--prompt", "x", *model])
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 3
    check = runner.invoke(app, ["rewards", "check", "demo", "--batch", "2", *model,
                                "--set", "train.reward.guards=[clip_score]"])  # fmt: skip
    assert check.exit_code == 0, check.output
    roles = {line.split()[0]: line.split()[1] for line in check.stdout.splitlines()[1:]}
    assert roles == {"jpeg_compressibility": "weight", "clip_score": "guard"}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["-r", "no_such_reward"], "unknown reward"),
        (["-r", "clip_score"], "clip.model_path"),
        (["-r", "brightness", "--prompts-file", "PROMPTS"], "has 1 lines for 2 images"),
    ],
)
def test_bad_input_exits_2_with_one_line(pictures, tmp_path, arguments, message):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("only one\n")
    arguments = [str(prompts) if a == "PROMPTS" else a for a in arguments]
    result = runner.invoke(app, ["rewards", "score", *map(str, pictures), *arguments])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


@pytest.mark.slow
def test_score_gives_each_image_its_metadata_record(pictures, tmp_path):
    """`geneval` reads each image's GenEval record from --metadata-file (one JSON object per line), as the training
    workers pass each prompt's `metadata`; a missing record is refused naming the image."""
    import json

    from unirl_core.models.tiny_clip import write_tiny_clip
    from unirl_core.models.tiny_owl import write_tiny_owl
    from unirl_core.rewards.geneval import GenEvalScore

    owl, clip = write_tiny_owl(tmp_path / "owl"), write_tiny_clip(tmp_path / "clip")
    records = [{"tag": "single_object", "include": [{"class": "cat", "count": 1}]},
               {"tag": "counting", "include": [{"class": "dog", "count": 2}]}]  # fmt: skip
    metadata = tmp_path / "metadata.jsonl"
    metadata.write_text("".join(json.dumps(r) + "\n" for r in records))
    model = ["--set", f"train.reward.geneval.detector_path={owl}", "--set", f"train.reward.geneval.clip_path={clip}"]
    arguments = ["rewards", "score", *map(str, pictures), "-r", "geneval", "--prompt", "x", *model]
    result = runner.invoke(app, [*arguments, "--metadata-file", str(metadata)])
    assert result.exit_code == 0, result.output
    expected = GenEvalScore(owl, clip)([Image.open(p).convert("RGB") for p in pictures], ["x", "x"], metadata=records)
    assert [float(line.split()[-1]) for line in result.stdout.splitlines()[1:]] == pytest.approx(expected, abs=1e-4)
    missing = runner.invoke(app, arguments)
    assert missing.exit_code == 2 and str(pictures[0]) in missing.stderr and "Traceback" not in missing.output
