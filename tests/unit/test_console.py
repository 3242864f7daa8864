"""The `unirl` command's progress display (flows/console.py), drawn on a recording terminal."""

from __future__ import annotations

import io

from rich.console import Console

from flows import console
from tasks import progress


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=160, color_system=None)


def test_the_display_follows_each_stage_with_its_rate_step_and_reward(monkeypatch):
    screen = terminal()
    monkeypatch.setattr(console, "stderr", screen)
    with console.CommandProgress(train_steps=4) as display:
        progress.report("stage", "ingest")
        progress.report("total_rows", 10)
        progress.report("rows", 4)
        progress.report("rows", 6)
        ingest_bar = display.bar.tasks[display.current]
        assert (ingest_bar.completed, ingest_bar.total, ingest_bar.description) == (10, 10, "ingest")
        progress.report("stage", "train")
        progress.report("train_step", {"step": 0, "stage": "warmup", "round": 0, "warmup_loss": 0.5})
        rl_row = {"step": 2, "stage": "rl", "round": 0, "reward_mean": -1.25, "loss": 0.01, "images_per_s": 8.0}
        progress.report("train_step", rl_row)
        display.line("a line above the bar")
        display.bar.refresh()
        train_bar = display.bar.tasks[display.current]
        assert (train_bar.completed, train_bar.total) == (3, 4)
        drawn = screen.file.getvalue()
    assert "train" in drawn and "3/4" in drawn and "reward -1.2500" in drawn and "8.0 img/s" in drawn
    assert "a line above the bar" in drawn
    assert progress._listeners == []  # the display stops listening when the command ends


def test_without_a_terminal_nothing_is_drawn_and_lines_go_to_stdout(monkeypatch, capsys):
    piped = Console(file=io.StringIO(), force_terminal=False)
    monkeypatch.setattr(console, "stderr", piped)
    monkeypatch.setattr(console, "stdout", Console(file=__import__("sys").stdout))
    with console.CommandProgress() as display:
        progress.report("stage", "ingest")
        progress.report("rows", 3)
        display.line("  step row")
    assert piped.file.getvalue() == ""  # not even a blank line in a pipe
    assert capsys.readouterr().out == "  step row\n"


def test_an_error_line_names_the_type_the_first_line_and_the_log_file(tmp_path, monkeypatch):
    log = tmp_path / "logs" / "x.log"
    monkeypatch.setenv(console.LOG_FILE_ENV, str(log))
    try:
        raise RuntimeError("the worker died\n  (its traceback)\n")
    except RuntimeError as exc:
        line = console.error_line(exc)
    assert line.splitlines() == ["error: RuntimeError: the worker died", f"  the traceback is in {log}; `unirl --verbose ...` prints it"]  # fmt: skip
    assert "Traceback (most recent call last)" in log.read_text() and "the worker died" in log.read_text()


def test_every_state_of_the_display_fits_80_columns_whole(monkeypatch):
    """On an 80-column terminal each state (starting, ingest at a rate, a warm-up step, an RL step at a long step
    count) draws on one line of at most 80 characters, its information whole (never cut to `…`)."""
    from rich.console import Console

    screen = Console(file=io.StringIO(), force_terminal=True, width=80, color_system=None)
    monkeypatch.setattr(console, "stderr", screen)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with console.CommandProgress(train_steps=1200) as display:

        def drawn() -> list[str]:  # the current bar as an 80-column terminal draws it
            width80 = Console(file=io.StringIO(), force_terminal=True, width=80, color_system=None)
            width80.print(display.bar.make_tasks_table([display.bar.tasks[display.current]]))
            return width80.file.getvalue().rstrip("\n").splitlines()

        states = [(drawn(), display.bar.tasks[display.current].fields["info"])]
        progress.report("stage", "ingest")
        progress.report("total_rows", 123456)
        for _ in range(3):
            progress.report("rows", 40000)
        states.append((drawn(), display.bar.tasks[display.current].fields["info"]))
        progress.report("stage", "train")
        progress.report("train_step", {"step": 7, "stage": "warmup", "round": 0, "warmup_loss": 0.53125})
        states.append((drawn(), display.bar.tasks[display.current].fields["info"]))
        rl_row = {"step": 1037, "stage": "rl", "round": 12, "reward_mean": -1.25, "loss": 0.01, "images_per_s": 18.0}
        progress.report("train_step", rl_row)
        states.append((drawn(), display.bar.tasks[display.current].fields["info"]))
    for lines, info in states:
        assert len(lines) == 1 and len(lines[0]) <= 80 and "…" not in lines[0], lines
        assert info and info in lines[0], (info, lines)


def test_without_a_terminal_a_silence_becomes_a_line_saying_what_runs(monkeypatch):
    """Piped, the command is never silent for more than QUIET_S: a line on stderr names the stage, its progress and
    its time; a printed line resets the wait."""
    import time

    piped = Console(file=io.StringIO(), force_terminal=False)
    monkeypatch.setattr(console, "stderr", piped)
    monkeypatch.setattr(console, "stdout", Console(file=io.StringIO()))
    monkeypatch.setattr(console.CommandProgress, "QUIET_S", 0.3)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with console.CommandProgress(train_steps=24) as display:
        time.sleep(0.9)
        starting = piped.file.getvalue()
        progress.report("stage", "train")
        time.sleep(0.9)
        display.line("  a step")
        before = piped.file.getvalue()
    lines = starting.splitlines()
    assert lines and all(line.startswith("  ... starting") for line in lines), starting
    assert "Prefect's temporary server" in lines[0]
    assert "  ... train: 0 of 24 steps" in before and "starting the round" in before
    assert piped.file.getvalue() == before  # stopped with the command


def test_prefects_history_is_per_workspace_unless_the_user_chose_a_prefect_home_or_database(tmp_path, monkeypatch):
    """`unirl` points Prefect's server database into the workspace ($UNIRL_HOME/prefect/prefect.db); the next command
    in another workspace (a child process inherits the environment) moves it there; a user's PREFECT_HOME or
    database stands."""
    import os

    from flows.console import DATABASE_SET_ENV, workspace_prefect_database

    for name in ("PREFECT_HOME", "PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL",
                 DATABASE_SET_ENV):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for home in ("one", "two"):
        monkeypatch.setenv("UNIRL_HOME", str(tmp_path / home))
        workspace_prefect_database()
        url = os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"]
        assert url == f"sqlite+aiosqlite:///{(tmp_path / home).resolve()}/prefect/prefect.db"
        assert (tmp_path / home / "prefect").is_dir()
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", "postgresql+asyncpg://db/prefect")
    workspace_prefect_database()
    assert os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] == "postgresql+asyncpg://db/prefect"
    monkeypatch.delenv("PREFECT_SERVER_DATABASE_CONNECTION_URL")
    monkeypatch.delenv(DATABASE_SET_ENV)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "mine"))
    workspace_prefect_database()
    assert "PREFECT_SERVER_DATABASE_CONNECTION_URL" not in os.environ
