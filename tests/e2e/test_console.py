"""The installed `unirl` console script, run as a user runs it (a subprocess of the project's virtualenv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

UNIRL = str(Path(sys.executable).parent / "unirl")


def unirl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [UNIRL, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def test_help_lists_every_command():
    result = unirl("--help")
    assert result.returncode == 0, result.stderr
    for command in ("validate", "schema", "recipes", "prompts", "ingest", "shards", "tiny-models", "workspace"):
        assert command in result.stdout


def test_validate_packaged_recipe_by_name():
    result = unirl("validate", "prompts_file", env={"DATA_PATH": "/data/p.txt"})
    assert result.returncode == 0, result.stderr
    assert "data_path: /data/p.txt" in result.stdout
    result = unirl("validate", "prompts_file", "--set", "train.data.prompts_per_rollout=-1", env={"DATA_PATH": "x.txt"})
    assert result.returncode == 2
    assert "train.data.prompts_per_rollout: got '-1'; Input should be greater than 0" in result.stderr
    assert result.stderr.startswith("error: recipe ") and "Traceback" not in result.stderr
    result = unirl("prompts", "show", "/nonexistent/prompts.txt")  # a UserError raised by the core
    assert result.returncode == 2 and result.stderr == "error: /nonexistent/prompts.txt: no such prompt file\n"


@pytest.mark.slow
def test_prompts_check_runs_a_prefect_flow(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL

    (tmp_path / "ok.txt").write_text("a\nb\nc\n")
    (tmp_path / "bad.json").write_text(json.dumps([{"prompt": "x", "guidance_scale": 7}]))
    env = {"PREFECT_API_URL": PREFECT_API_URL.value()}
    result = unirl("prompts", "check", str(tmp_path / "ok.txt"), env=env)
    assert result.returncode == 0, result.stderr
    assert f"{tmp_path / 'ok.txt'}: 3 prompts" in result.stdout
    result = unirl("prompts", "check", str(tmp_path / "ok.txt"), str(tmp_path / "bad.json"), env=env)
    assert result.returncode == 2
    assert "bad.json: error:" in result.stdout and "train.sampling.guidance_scale" in result.stdout
