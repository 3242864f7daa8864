"""The installed `unirl` console script, run as a user runs it (a subprocess of the project's virtualenv)."""

from __future__ import annotations

import json
import os
import re
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


def _fresh_machine_env(tmp_path: Path) -> dict:
    """A new user's environment: a fresh workspace and PREFECT_HOME, no server, no telemetry opt-out of ours."""
    env = {**os.environ, "UNIRL_HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "prefect")}
    for name in ("PREFECT_API_URL", "DO_NOT_TRACK", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"):
        env.pop(name, None)
    return env


@pytest.mark.slow
def test_a_runtime_error_is_one_line_and_the_libraries_talk_to_the_log_file(tmp_path):
    """`unirl ingest` on a fresh machine, twice. A local input pattern matching no file is refused before Prefect
    starts: one line, exit 2, no temporary server, no database. An input that is there but not a parquet file fails
    inside the flow (Prefect starts its temporary server and creates its database): the terminal shows the one error
    line (no Prefect log lines, traceback, "database is locked" or telemetry failure; piped, the command's own
    `  ... starting` lines may come before it); the command's log file holds Prefect's lines and the error's
    traceback."""

    def ingest(pattern: str):
        recipe = tmp_path / "ingest.yaml"
        recipe.write_text(json.dumps({"ingest": {"dataset_output_root": str(tmp_path / "out"),
                                                 "download_parquet": {"parquet_pattern": pattern}}}))  # fmt: skip
        return subprocess.run([UNIRL, "ingest", str(recipe)], capture_output=True, text=True, timeout=300,
                              env=_fresh_machine_env(tmp_path))  # fmt: skip

    pattern = str(tmp_path / "nothing" / "*.parquet")
    result = ingest(pattern)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"error: download_parquet.parquet_pattern '{pattern}' matches no file\n"
    assert not (tmp_path / "prefect").exists() and not list((tmp_path / "home").glob("logs/*.log"))  # no Prefect

    (tmp_path / "inputs").mkdir()
    (tmp_path / "inputs" / "rows.parquet").write_bytes(b"not a parquet file" * 8)
    result = ingest(str(tmp_path / "inputs" / "*.parquet"))
    assert result.returncode == 2
    said = [line for line in result.stderr.splitlines() if not line.startswith("  ... ")]  # but its progress lines
    assert len(said) == 1 and result.stdout == "", result.stderr
    assert said[0].startswith(f"error: {tmp_path / 'inputs' / 'rows.parquet'}: not a readable parquet file")
    [log] = (tmp_path / "home").glob("logs/*-ingest-*.log")
    text = log.read_text()
    assert "Starting temporary server" in text and "Traceback" in text and "IngestInputError" in text
    assert "telemetry" not in text.lower()  # never attempted: the command turns it off


@pytest.mark.slow
def test_ingest_in_a_terminal_draws_one_progress_display_and_prints_the_summary(prefect_harness, tmp_path):
    """In a terminal (a pseudo-terminal here) the ingest draws its progress bar (rows, rate) and ends with the
    summary table; no Prefect log line tears it."""
    import pty

    from prefect.settings import PREFECT_API_URL

    from unirl_core.data.synthetic import write_synthetic_parquet

    parquet = tmp_path / "rows.parquet"
    write_synthetic_parquet(str(parquet), rows=24)  # and 3 bad rows
    env = {**_fresh_machine_env(tmp_path), "PREFECT_API_URL": PREFECT_API_URL.value(), "INPUT_PARQUET": str(parquet),
           "DATASET_ROOT": str(tmp_path / "dataset"), "DATA_PATH": str(parquet), "COLUMNS": "120"}  # fmt: skip
    leader, follower = pty.openpty()
    process = subprocess.Popen([UNIRL, "ingest", "pipeline_demo"], stdin=follower, stdout=follower, stderr=follower,
                               env=env)  # fmt: skip
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        screen += chunk
    assert process.wait(timeout=120) == 0, screen.decode(errors="replace")[-3000:]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))  # the drawn text, no escapes
    assert re.search(r"ingest ━+ 27/27 rows .* \d+ rows/s", text), text  # the bar: stage, rows of the total, rate
    assert re.search(r"ok\s+│\s+24", text), text  # the summary table
    assert "Flow run" not in text and "Task run" not in text and "Traceback" not in text
