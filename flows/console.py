"""What the `unirl` command prints, and where everything else goes.

    prepare(command, verbose)   before a command imports Prefect, MLflow or Ray: telemetry off, a patient Prefect
                                start-up, and every library's chatter routed to the command's log file
    CommandProgress             one Rich progress display per command (stage, step, reward/loss, images/s, ETA)
                                that nothing else writes through
    error_line(exc)             an unexpected error as one line naming the log file that holds its traceback

The terminal shows our own lines, the progress display, warnings from the `unirl.*` loggers and errors. Prefect's
flow and task run logs go to the Prefect API (its UI shows them) and to the log file; Prefect's own server, its
database and services, MLflow's database set-up, Python warnings and INFO logs of other libraries go to the log
file only: `$UNIRL_HOME/logs/<time>-<command>.log`. `unirl --verbose COMMAND` (or UNIRL_VERBOSE=1) keeps every
library's own console logging and prints tracebacks.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

LOG_FILE_ENV = "UNIRL_LOG_FILE"
VERBOSE_ENV = "UNIRL_VERBOSE"
KEEP_LOG_FILES = 50
PREFECT_LOGGING = Path(__file__).with_name("logging.yml")

# Set for every command unless the user chose otherwise: no telemetry from anything we start (Prefect's client and
# its temporary server, MLflow, Ray, the Hugging Face hub), and a Prefect start-up that outlasts a first database
# migration on a slow machine (about 20 s, exactly Prefect's default timeout).
PREFECT_DATABASE_ENV = ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL")
ENV_DEFAULTS = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # `models:/` downloads: no tqdm bars over our display
}

# the quiet libraries: INFO and below to the log file only (their WARNINGs still reach the terminal)
QUIET_LOGGERS = ("mlflow", "alembic", "ray", "httpx", "urllib3", "filelock", "torch", "diffusers", "transformers")

# True in the `unirl` console script's process (flows/supervise.py); False where the app runs inside another
# program (a test runner's CliRunner, a notebook), whose logging and environment we leave as they are.
is_console_script = False

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


verbose_option = False  # `unirl --verbose`, set for each command by prepare()


def verbose() -> bool:
    return verbose_option or os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def log_file() -> Path | None:
    path = os.environ.get(LOG_FILE_ENV)
    return Path(path) if path else None


class LogFile(logging.FileHandler):
    """Appends to the command's log file (UNIRL_LOG_FILE), opened at the first record; the processes a command
    starts (Prefect's temporary server) inherit the variable and append to the same file. Without it, nothing."""

    def __init__(self) -> None:
        path = log_file()
        super().__init__(path or os.devnull, mode="a", encoding="utf-8", delay=True)

    def _open(self):
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


DATABASE_SET_ENV = "UNIRL_PREFECT_DATABASE"  # the database URL unirl set (not a user's: a later command resets it)


def workspace_prefect_database() -> None:
    """Prefect's history (its server's database, temporary or `unirl serve`'s) per workspace, like MLflow's, unless
    the user chose a Prefect home or database; the Prefect home (profiles) stays the user's."""
    chosen = [n for n in ("PREFECT_HOME", *PREFECT_DATABASE_ENV) if os.environ.get(n)]
    if any(os.environ[n] != os.environ.get(DATABASE_SET_ENV) for n in chosen):  # a user's choice stands
        return
    from unirl_core.workspace import workspace

    database = workspace().root.resolve() / "prefect" / "prefect.db"
    database.parent.mkdir(parents=True, exist_ok=True)
    url = f"sqlite+aiosqlite:///{database}"
    os.environ["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = os.environ[DATABASE_SET_ENV] = url


def prepare(command: str, verbose_: bool = False) -> Path | None:
    """Set up the console script's process for `command`; returns the log file (None under --verbose, or inside
    another program: its logging and environment stay as they are)."""
    global verbose_option
    verbose_option = verbose_
    if not is_console_script:
        return None
    from flows import interrupt
    from flows.serve import running_prefect_api

    if command != "serve":  # `unirl serve` stops its servers on SIGINT itself
        interrupt.install()
    from unirl_core.workspace import workspace

    for name, value in ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    workspace_prefect_database()
    if not os.environ.get("PREFECT_API_URL") and command != "serve":
        served = running_prefect_api()
        if served:  # `unirl serve` runs: its server, not a temporary one (no start-up wait, runs in its UI)
            os.environ["PREFECT_API_URL"] = served
    if verbose() or "prefect" in sys.modules:
        return None
    folder = workspace().root.resolve() / "logs"
    path = folder / f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{os.getpid()}.log"
    os.environ[LOG_FILE_ENV] = str(path)
    os.environ.setdefault("PREFECT_LOGGING_SETTINGS_PATH", str(PREFECT_LOGGING))
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    _route_logging()
    _prune(folder)
    return path


def _route_logging() -> None:
    """This process's logging: WARNING and above on the terminal (drawn above the progress display), everything
    from INFO in the log file; Python warnings to the log file only."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    root.setLevel(logging.INFO)
    terminal = RichHandler(console=stderr, level=logging.WARNING, show_time=False, show_path=False, markup=False)
    written = LogFile()
    written.setFormatter(logging.Formatter("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s"))
    root.handlers[:] = [terminal, written]
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)
    warnings_logger = logging.getLogger("py.warnings")
    warnings_logger.handlers[:] = [written]
    warnings_logger.propagate = False


def _prune(folder: Path) -> None:
    """Keep the newest KEEP_LOG_FILES log files."""
    if not folder.is_dir():
        return
    for old in sorted(folder.glob("*.log"))[:-KEEP_LOG_FILES]:
        old.unlink(missing_ok=True)


def error_line(exc: BaseException) -> str:
    """`error: <Type>: <first line>` and where the whole traceback is (the log file, or --verbose)."""
    import traceback

    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = f"error: {type(exc).__name__}: {first}" if first else f"error: {type(exc).__name__}"
    path = log_file()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(traceback.format_exception(exc)))
        return f"{text}\n  the traceback is in {path}; `unirl --verbose ...` prints it"
    return f"{text}\n  `unirl --verbose ...` prints the traceback"


class CommandProgress:
    """The command's one progress display, fed by the tasks' reports (tasks/progress.py): a bar per stage as it
    starts (ingest rows, precache samples, training steps) with its rate, ETA and, for training, the step's reward
    or loss. Drawn on stderr when it is a terminal and cleared at the end (only results stay on screen); `line()`
    prints above it, or to stdout when nothing is drawn, so piped output stays plain lines."""

    UNITS = {"ingest": "rows", "precache": "samples", "train": "steps", "eval": "images"}
    QUIET_S = 4.5  # without a terminal: the longest silence before a line saying what the command is doing (< 5 s)

    def __init__(self, train_steps: int | None = None, prefect: bool = True) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.train_steps, self.prefect = train_steps, prefect
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=16),  # the line fits 80 columns with its information whole
            MofNCompleteColumn(),
            TextColumn("{task.fields[unit]}"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=stderr,
            transient=True,
            redirect_stdout=False,  # Prefect's and Ray's handlers keep the stream they first saw: never a proxy
            redirect_stderr=False,
        )
        self.current: Any = None
        self.stage = ""
        self._lock = threading.Lock()  # reports come from the flow's threads and the ingest workers' progress thread
        self._last_line = self._stage_started = time.monotonic()
        self._done = threading.Event()

    def __enter__(self) -> CommandProgress:
        from tasks import progress

        if stderr.is_terminal:  # drawn only where someone watches (nothing, not even a blank line, in a pipe)
            self.bar.start()
        else:  # a pipe or a log file: a line on stderr after QUIET_S without one (what runs, for how long)
            threading.Thread(target=self._keep_talking, name="unirl-progress-lines", daemon=True).start()
        self.start_stage("starting")  # until the first stage reports (imports, Prefect's temporary server)
        if self.prefect and not os.environ.get("PREFECT_API_URL"):
            self.bar.update(self.current, info="Prefect's temporary server (`unirl serve` saves it)")
        progress.add_listener(self.report)
        return self

    def __exit__(self, *exc) -> None:
        from tasks import progress

        progress.remove_listener(self.report)
        with self._lock:  # no progress line after the command's own output ends
            self._done.set()
        if self.bar.live.is_started:
            self.bar.stop()

    def _keep_talking(self) -> None:
        while not self._done.wait(min(0.25, self.QUIET_S / 2)):
            with self._lock:
                if time.monotonic() - self._last_line >= self.QUIET_S and not self._done.is_set():
                    stderr.file.write(f"  ... {self.doing()}\n")
                    stderr.file.flush()
                    self._last_line = time.monotonic()

    def doing(self) -> str:
        """The current stage as a line: `train: 0 of 24 steps, 16 s (starting the round: ...)`."""
        task = self.bar.tasks[self.current]
        unit, info = task.fields.get("unit", ""), task.fields.get("info", "")
        what = task.description
        if task.total:
            what += f": {int(task.completed)} of {int(task.total)} {unit}"
        elif task.completed:
            what += f": {int(task.completed)} {unit}"
        what += f", {time.monotonic() - self._stage_started:.0f} s"
        if self.stage == "train" and not task.completed:
            info = info or "starting the round: Ray, the workers building the model"
        return what + (f" ({info})" if info else "")

    def line(self, text: str) -> None:
        self._last_line = time.monotonic()
        if self.bar.live.is_started:
            self.bar.console.print(text, markup=False, highlight=False)
        else:
            stdout.file.write(text + "\n")
            stdout.file.flush()

    def start_stage(self, stage: str, total: int | None = None) -> None:
        if self.current is not None:
            self.bar.update(self.current, visible=False)
        self.stage, self._stage_started = stage, time.monotonic()
        self.current = self.bar.add_task(stage, total=total, unit=self.UNITS.get(stage, ""), info="")

    def report(self, kind: str, amount: Any) -> None:
        with self._lock:
            self._report(kind, amount)

    def _report(self, kind: str, amount: Any) -> None:
        if kind == "stage" and amount != self.stage:  # (ingest rows may come first: `unirl ingest`'s head start)
            self.start_stage(amount, self.train_steps if amount == "train" else None)
        elif self.stage == "starting":
            training = kind in ("train_step", "train_eval")  # (an eval point comes before the first step)
            self.start_stage("train" if training else "ingest", self.train_steps if training else None)
        if kind == "total_rows":
            self.bar.update(self.current, total=amount)
        elif kind == "rows":
            self.bar.advance(self.current, amount)
            task = self.bar.tasks[self.current]
            if task.speed:
                self.bar.update(self.current, info=f"{task.speed:.0f} {self.UNITS.get(self.stage, 'rows')}/s")
        elif kind == "train_step":
            self._train_step(amount)

    def _train_step(self, row: dict) -> None:
        if row["stage"] == "warmup":
            info = f"warm-up loss {row['warmup_loss']:.4f}"
        else:
            info = f"round {row['round']}  reward {row['reward_mean']:+.4f}"  # the step's line has the rest
            info += f"  {row['images_per_s']:.1f} img/s" if row.get("images_per_s") else ""
        self.bar.update(self.current, completed=row["step"] + 1, info=info)
