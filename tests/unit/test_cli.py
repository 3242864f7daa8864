"""The `unirl` commands that need no orchestration, run in-process through the real typer app."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app

runner = CliRunner()


def run(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env=env)


def test_validate_prints_resolved_yaml():
    result = run("validate", "demo", "--set", "train.sampling.height=64")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["train"]["sampling"]["height"] == 64
    assert resolved["train"]["data"]["prompts_per_rollout"] == 2


def test_validate_reports_every_error_and_exits_2():
    result = run("validate", "prompts_file", "--set", "train.data.prompt_key=", "-s", "train.sampling.widht=64")
    assert result.exit_code == 2
    assert "train.data.data_path: got '${env:DATA_PATH}'; environment variable DATA_PATH is not set" in result.stderr
    result = run("validate", "demo", "-s", "train.sampling.widht=64", "-s", "train.sampling.height=7")
    assert result.exit_code == 2
    assert "train.sampling.widht: got '64'; unknown key; did you mean 'width'?" in result.stderr
    assert "train.sampling.height: got '7'; Input should be a multiple of 8" in result.stderr
    assert result.stdout == ""


def test_recipes_lists_packaged_recipes():
    result = run("recipes")
    assert result.exit_code == 0
    assert [line.split()[0] for line in result.stdout.splitlines()] == [
        "demo",
        "ingest_parquet",
        "pipeline_demo",
        "prompts_file",
    ]


@pytest.fixture
def seed_files(tmp_path):
    (tmp_path / "frames").mkdir()
    rows = [
        {"prompt": "A watercolor landscape with snowy mountains at sunrise.", "style": "watercolor"},
        {
            "prompt": "Animate this scene with gentle falling snow.",
            "media_refs": [{"modality": "image", "role": "condition", "uri": "frames/scene_01.png"}],
        },
        {"caption": "A cinematic portrait of a robot reading under warm light.", "metadata": {"src": "x"}},
    ]
    good = tmp_path / "prompts.json"
    good.write_text(json.dumps(rows))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "x", "seed": 3}\n')
    return good, bad


def test_prompts_show_prints_normalized_json_lines(seed_files, tmp_path):
    good, _ = seed_files
    result = run("prompts", "show", str(good))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt_id"] for r in rows] == ["prompts.json:0", "prompts.json:1", "prompts.json:2"]
    assert rows[0]["metadata"] == {"style": "watercolor"}
    assert rows[1]["media_refs"] == [
        {"modality": "image", "role": "condition", "uri": str(tmp_path / "frames" / "scene_01.png")}
    ]
    assert rows[2]["prompt"].startswith("A cinematic") and rows[2]["metadata"] == {"src": "x"}
    assert result.stderr.strip() == f"3 prompts from {good}"


def test_prompts_show_limit_and_groups(seed_files):
    good, _ = seed_files
    result = run("prompts", "show", str(good), "--limit", "2", "--samples-per-prompt", "3")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["group_id"], r["sample_id"]) for r in rows] == [
        (0, "prompt:0:sample:0"),
        (0, "prompt:0:sample:1"),
        (0, "prompt:0:sample:2"),
        (1, "prompt:1:sample:0"),
        (1, "prompt:1:sample:1"),
        (1, "prompt:1:sample:2"),
    ]
    assert rows[3]["prompt_id"] == "prompts.json:1"
    assert "2 of 3 prompts x 3 = 6 samples" in result.stderr


def test_prompts_show_fails_cleanly_on_bad_input(seed_files, tmp_path):
    _, bad = seed_files
    result = run("prompts", "show", str(bad))
    assert result.exit_code == 2
    assert f"error: {bad}, line 2: row field(s) ['seed'] try to set sampling" in result.stderr
    assert "train.sampling.seed" in result.stderr and result.stdout == ""
    (tmp_path / "p.yaml").write_text("- a")
    result = run("prompts", "show", str(tmp_path / "p.yaml"))
    assert result.exit_code == 2 and "use one of .txt, .jsonl, .json" in result.stderr


def test_tiny_models_refuses_unknown_family_and_non_empty_folder(tmp_path):
    result = run("tiny-models", str(tmp_path / "m"), "--family", "sdxl")
    assert result.exit_code == 2 and "model family 'sdxl' is unknown: choose one of sd15, sd3" in result.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    result = run("tiny-models", str(tmp_path / "full"))
    assert result.exit_code == 2 and "is not an empty folder" in result.stderr
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def test_workspace_follows_unirl_home(tmp_path):
    result = run("workspace", env={"UNIRL_HOME": str(tmp_path / "ws"), "MLFLOW_TRACKING_URI": ""})
    assert result.exit_code == 0, result.output
    assert f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}" in result.stdout


def test_schema_is_the_recipe_json_schema():
    result = run("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"name", "description", "ingest", "precache", "train"}


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.startswith("unirl ")
