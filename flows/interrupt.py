"""Ctrl-C for the console script: the first SIGINT stops the command within seconds, a second one at once.

On the first SIGINT the command prints one line (what is kept and the command that resumes), marks its Prefect flow
run Cancelled (best effort, at most `MARK_S` seconds: a temporary API server got the same Ctrl-C and may be gone),
and exits with 130. The supervisor (flows/supervise.py) then stops everything the command started: the local Ray
(its workers and the reward actors), Prefect's temporary server. Nothing is left half-written: every commit
(checkpoint, shard, metric row) is written aside and renamed, its record last, so a stop at any instant leaves the
last committed state, which the same command resumes from. Prefect's and Ray's own handling of the interrupt (crash
hooks retrying against a server that died with the same Ctrl-C, rounds running on to their commit) is skipped.

    interrupt.install()                         # the console script, for every command but `serve`
    interrupt.keep(lambda: "checkpoint ...")    # what a running command would keep (printed on Ctrl-C)
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable

EXIT = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
MARK_S = 2.0
_kept: list[Callable[[], str]] = []
_interrupted = False


def install() -> None:
    """Handle SIGINT in this process (the main thread) as the module says."""
    signal.signal(signal.SIGINT, _on_sigint)


def keep(describe: Callable[[], str]) -> None:
    """Register what the command would keep if stopped now (called on Ctrl-C; the last registered is printed)."""
    _kept.append(describe)


def _on_sigint(signum, frame) -> None:
    global _interrupted
    if _interrupted:  # the second Ctrl-C: at once
        os._exit(EXIT)
    _interrupted = True
    kept = "every committed shard, step and checkpoint is kept"
    if _kept:
        with contextlib.suppress(Exception):  # the stop must not fail on its message
            kept = _kept[-1]()
    command = shlex.join(["unirl", *sys.argv[1:]])
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    restore = "\r\x1b[2K\x1b[?25h" if os.isatty(2) else ""  # the progress display's line, the cursor it hid
    os.write(2, f"{restore}\ninterrupted: {kept}; rerun `{command}` to go on from there\n".encode())
    _mark_flow_run_cancelled()
    os._exit(EXIT)


def _mark_flow_run_cancelled() -> None:
    """The running Prefect flow run (if any) -> Cancelled, within MARK_S seconds or not at all."""
    if "prefect" not in sys.modules:
        return
    try:
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        flow_run_id = context.flow_run.id if context and context.flow_run else None
    except Exception:  # noqa: BLE001
        return
    if flow_run_id is None:
        return

    def mark() -> None:
        try:
            from prefect.client.orchestration import get_client
            from prefect.states import Cancelled

            with get_client(sync_client=True) as client:
                client.set_flow_run_state(flow_run_id, Cancelled(message="interrupted (Ctrl-C)"), force=True)
        except Exception:  # noqa: BLE001 - a temporary server may be gone with the same Ctrl-C
            pass

    thread = threading.Thread(target=mark, daemon=True)
    thread.start()
    thread.join(MARK_S)
