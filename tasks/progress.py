"""In-process progress listeners: the `unirl` command registers a Rich progress bar here; tasks report to it.

Tasks run in the flow's process (thread pool), so a plain list of callables is enough. Nothing listens when a
flow runs under a deployment worker; the Prefect progress artifact covers that case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_listeners: list[Callable[[str, Any], None]] = []


def add_listener(listener: Callable[[str, Any], None]) -> None:
    _listeners.append(listener)


def remove_listener(listener: Callable[[str, Any], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def report(kind: str, amount: Any) -> None:
    """`kind` is "total_rows" (announce the work), "rows" (rows finished), "train_step" (a metrics row) or
    "train_eval" (a `train.eval` point)."""
    for listener in list(_listeners):
        listener(kind, amount)
