"""Prefect's `flow` decorator, with one change to its engine: a flow run's end no longer waits out the heartbeat
thread's sleep. Every flow module takes `flow` from here.

Prefect 3.8's sync flow engine sends heartbeats (an event every `flows.heartbeat_frequency` seconds, 180 by default,
by which a crashed run can be found) from a thread that sleeps in 1-second steps, and joins that thread when the run
ends: 0-1 s, 0.5 s on average, at the end of every flow and subflow run (`unirl ingest` of 2,000 images: 9.2 ->
8.9 s on average over 6 runs). `_send_heartbeats` below is Prefect's own (prefect 3.8.8, flow_engine.py) with the
thread waiting on its stop event instead: the join returns at once, unless a heartbeat is being sent, which it still
waits for (a heartbeat sent during teardown would race the process's exit). Heartbeats are sent as before. Where
Prefect's function is not the one this was copied from (the SHA-256 of its source), its own stays.
"""

from __future__ import annotations

import contextvars
import hashlib
import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import prefect.flow_engine
from prefect import flow

__all__ = ["flow"]
JOIN_TIMEOUT_S = 2.0  # Prefect's
PREFECTS_OWN = prefect.flow_engine._send_heartbeats  # what `_install` replaces (the tests compare the two)
# inspect.getsource(prefect.flow_engine._send_heartbeats) of prefect 3.8.8, the function copied below
PREFECT_3_8_8_SHA256 = "83e152cb73a04e977ca181188e99b3d583c894892b5456043b2eb51e45dbe996"


@contextmanager
def _send_heartbeats(engine, join_on_exit: bool = True) -> Iterator[None]:
    seconds = engine.heartbeat_seconds
    if seconds is None:
        yield
        return
    seconds = max(seconds, prefect.flow_engine.MINIMUM_HEARTBEAT_INTERVAL)
    resource, related = engine._build_heartbeat_event_template()
    stop = threading.Event()

    def heartbeat_loop() -> None:
        while not stop.is_set():
            state = engine.flow_run.state if engine.flow_run else None
            if state is not None and state.is_final():
                return
            try:
                engine._emit_flow_run_heartbeat(resource, related)
            except Exception:
                engine.logger.debug("Failed to emit heartbeat", exc_info=True)
            stop.wait(seconds)

    # the thread sees this context's settings (the API URL), as in Prefect's
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(heartbeat_loop,), name="flow-run-heartbeat", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        if join_on_exit:
            thread.join(timeout=JOIN_TIMEOUT_S)


def _install() -> None:
    """Only over the function this copies: another Prefect release keeps its own (and the test says so)."""
    try:
        source = inspect.getsource(PREFECTS_OWN)
    except (OSError, TypeError):
        return
    if hashlib.sha256(source.encode()).hexdigest() == PREFECT_3_8_8_SHA256:
        prefect.flow_engine._send_heartbeats = _send_heartbeats


_install()
