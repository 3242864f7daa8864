"""Work units in worker processes: `download_num_processes` processes (img2dataset's `processes_count`), each running
whole units with its own `download_num_threads` fetch threads.

A process has its own interpreter lock, so the Python half of every row (urllib3, the reorder buffer, tar, JSON and
parquet writing) runs on every core at once instead of taking turns in one process (docs/ingest.md, Speed: 1.6 -> 1.95 of
2 cores busy). Outside `unit_processes`, `run_unit` runs the unit in the calling process, as before.

- The workers fork from multiprocessing's forkserver, which imports the ingest modules once, so a pool starts in
  milliseconds. The forkserver keeps the environment and working directory of its own start: each pool hands its
  workers the caller's current ones (credentials set later, a changed directory).
- A worker ends when the process that opened its pool does (killed included: it watches that process), and the
  forkserver and multiprocessing's resource tracker end once no worker holds them, so nothing outlives a killed
  flow.
- A worker that dies (a decoder crash, the OOM killer) fails only the units it was running, with WorkerDied: a
  transient error (the task's retry reruns the unit in a fresh pool). Other exceptions arrive as they were raised.
- Progress: the worker sends its rows to the caller's `on_row` over a queue, at most every 0.1 s, and all of them
  before `run_unit` returns.
- Overlap: `processes` units take rows at a time; once every row of a unit has started, the next unit starts in
  another worker while the last rows finish. Without it each unit ended with its slowest rows alone: on the open
  internet a dead host's timeout (docs/ingest.md, Slow and dead hosts).
- Head start (`head_start`, used by `unirl ingest`): the plan and the first `processes` units start before the
  command imports Prefect and creates its flow run (~1.5 s of one core, the others idle); the flow's
  `unit_processes` takes that pool and its tasks take the units already running. The plan is committed first, as
  the flow's own plan task would, and that task then finds it unchanged.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `prestart` runs before a command has read its recipe
    from unirl_core.config.ingest import IngestConfig
    from unirl_core.ingest.plan import WorkUnit

# Imported once in the forkserver, so every worker starts with them: the ingest code, and pandas, which pyarrow's
# parquet writer imports on first use (0.4 s of CPU that each worker would otherwise pay at its first unit's end).
PRELOAD = ["unirl_core.ingest.download", "pandas"]
logger = logging.getLogger(__name__)
PROGRESS_EVERY_S = 0.1
_context = (
    multiprocessing.get_context("forkserver") if "forkserver" in multiprocessing.get_all_start_methods() else None
)
_current: ContextVar[UnitProcesses | None] = ContextVar("unirl_unit_processes", default=None)
_head_start: UnitProcesses | None = None  # the pool `head_start` opened, until its block ends


class WorkerDied(RuntimeError):
    """A worker process ended while running a unit (killed, out of memory, a crash in native code). Transient: the
    unit's committed output is untouched and a retry reruns it."""


def prestart() -> None:
    """Start the forkserver now: it imports the ingest modules on another core while the caller goes on (reads its
    recipe, imports Prefect). Importing this module costs little for that reason."""
    if _context is not None:
        _set_preload()
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _set_preload() -> None:
    from multiprocessing import forkserver

    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:  # not started yet: the list still counts
        _context.set_forkserver_preload(PRELOAD)


class UnitProcesses:
    """Worker processes running units; `run_unit` from any number of threads. At most `processes` units take rows
    at a time; a unit whose rows have all started (only its last ones still running: a dead host among them waits
    out its timeout) gives its turn to the next unit, in another worker process, so that wait costs no throughput.
    Hence up to `max_units` = 2 x `processes` units are open at once."""

    def __init__(self, processes: int):
        self.processes = processes
        self.max_units = 2 * processes
        _set_preload()
        self._progress = _context.SimpleQueue()
        self._units: dict[int, _Unit] = {}  # by token: where each unit's progress messages go
        self._started: dict[tuple[str, WorkUnit], _Unit] = {}  # started ahead (`start`), not yet asked for
        self._tokens = itertools.count()
        self._turns = threading.Semaphore(processes)
        self._lock = threading.Lock()
        self._pool = self._new_pool()
        self._forwarder = threading.Thread(target=self._forward, name="unit-progress", daemon=True)
        self._forwarder.start()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.max_units,
            mp_context=_context,
            initializer=_start_worker,
            initargs=(os.getpid(), dict(os.environ), os.getcwd(), self._progress),
        )

    def start(
        self, root: str, units: list[WorkUnit], config: IngestConfig, on_row: Callable[[int], None] | None = None
    ) -> None:
        """Start the first `processes` of these units now, their rows reported to `on_row` (or held); `run_unit` for
        one of them (same root and config) then waits for that run instead of starting the unit again."""
        for unit in units[: self.processes]:
            running = self._submit(root, unit, config)
            running.report_to(on_row)
            self._started[(root, unit)] = running

    def run_unit(self, root: str, unit: WorkUnit, config: IngestConfig, on_row: Callable[[int], None] | None) -> dict:
        running = self._started.pop((root, unit), None)
        try:
            if running is not None and running.config != config:  # not the run the caller asks for: it ends first
                wait([running.future])
                self._units.pop(running.token, None)
                running = None
            if running is None:
                running = self._submit(root, unit, config)
            running.report_to(on_row)
            stats = running.future.result()
            running.finished.wait(timeout=10)  # its last rows are reported before the caller moves on
            return stats
        except BrokenProcessPool:
            with self._lock:
                broken = running.pool if running is not None else self._pool
                if self._pool is broken:  # the first thread to see it replaces the pool; the others just retry
                    broken.shutdown(wait=False, cancel_futures=True)
                    self._pool = self._new_pool()
            raise WorkerDied(
                f"a worker process ended while it ran unit {unit.name} ({unit.file} rows {unit.start}-{unit.stop}): "
                "killed or out of memory? The unit is retried; lower download_num_threads if memory is short"
            ) from None
        finally:
            if running is not None:
                self._units.pop(running.token, None)

    def _submit(self, root: str, unit: WorkUnit, config: IngestConfig) -> _Unit:
        """The unit submitted once it has a turn; the turn passes on when all its rows have started (or it ended)."""
        self._turns.acquire()
        running = _Unit(next(self._tokens), config, on_input_done=self._turns.release)
        try:
            with self._lock:  # never a pool another thread is replacing
                running.pool = self._pool
                self._units[running.token] = running
                running.future = running.pool.submit(_run_unit, root, unit, config, running.token)
        except BaseException:
            self._units.pop(running.token, None)
            running.input_is_done()
            raise
        running.future.add_done_callback(lambda _: running.input_is_done())  # ended early: committed, or an error
        return running

    def _forward(self) -> None:
        while (message := self._progress.get()) is not None:
            kind, token, rows = message
            running = self._units.get(token)
            if running is None:
                continue
            if kind == "rows":
                try:
                    running.rows(rows)
                except Exception:  # a progress display's fault must not stop the units' messages
                    logger.warning("a progress listener failed on unit rows", exc_info=True)
            elif kind == "input_done":
                running.input_is_done()
            elif kind == "end":
                running.finished.set()

    def close(self) -> None:
        """Wait for the running units, except when some were started and never asked for (the flow failed before
        them): then the workers are stopped (SIGTERM) and their units left uncommitted, with temporaries that the
        next run removes; nothing would read their progress any more."""
        with self._lock:
            if self._started:
                for process in list((getattr(self._pool, "_processes", None) or {}).values()):
                    process.terminate()
            self._pool.shutdown(wait=not self._started, cancel_futures=True)
        self._progress.put(None)
        self._forwarder.join(timeout=10)
        self._progress.close()


class _Unit:
    """A submitted unit: its future, its turn (given back once, when all its rows have started or it ended), and
    where its progress goes: rows done before a caller asks for the unit (one started ahead) are held until then."""

    def __init__(self, token: int, config: IngestConfig, on_input_done: Callable[[], None]):
        self.token, self.config = token, config
        self.pool: ProcessPoolExecutor | None = None
        self.future = None
        self.finished = threading.Event()
        self._on_input_done: Callable[[], None] | None = on_input_done
        self._on_row: Callable[[int], None] | None = None
        self._held = 0
        self._lock = threading.Lock()

    def input_is_done(self) -> None:
        with self._lock:
            give_back, self._on_input_done = self._on_input_done, None
        if give_back is not None:
            give_back()

    def rows(self, n: int) -> None:
        with self._lock:
            on_row = self._on_row
            if on_row is None:
                self._held += n
        if on_row is not None:
            on_row(n)

    def report_to(self, on_row: Callable[[int], None] | None) -> None:
        with self._lock:
            self._on_row, held, self._held = on_row, self._held, 0
        if on_row is not None and held:
            on_row(held)


@contextmanager
def unit_processes(processes: int) -> Iterator[UnitProcesses | None]:
    """Inside the block, `run_unit` (from this thread and the threads it starts with a copy of its context, as
    Prefect's task runner does) runs units in `processes` worker processes: those of `head_start` when it opened
    them for as many processes (it closes them), else new ones. Without a forkserver (Windows) units stay in this
    process."""
    if _context is None:
        yield None
        return
    started = _head_start if _head_start is not None and _head_start.processes == processes else None
    pool = started or UnitProcesses(processes)
    token = _current.set(pool)
    try:
        yield pool
    finally:
        _current.reset(token)
        if started is None:
            pool.close()


@contextmanager
def head_start(config: IngestConfig, on_row: Callable[[int], None] | None = None) -> Iterator[None]:
    """For a command about to run the ingest flow: commit the plan and start the first units now, in the pool that
    the flow's `unit_processes` will take; their rows go to `on_row` until the flow's tasks ask for the units. Left
    out (the flow does everything, as without it) where the plan copies or reads remote inputs, or fails: the flow's
    plan task then reports the error as usual."""
    global _head_start
    pool = None
    try:
        if _context is not None and _worth_it(config):
            pool = _start_ahead(config, on_row)
        _head_start = pool
        yield
    finally:
        _head_start = None
        if pool is not None:
            pool.close()


def _start_ahead(config: IngestConfig, on_row: Callable[[int], None] | None) -> UnitProcesses | None:
    from unirl_core.ingest.stages import stage_download_parquet

    pool = None
    try:
        units = stage_download_parquet(config)
        pool = UnitProcesses(config.download_images.download_num_processes)
        pool.start(config.dataset_output_root, units, config, on_row)
        return pool
    except Exception:
        logger.debug("no head start: it failed (the flow meets the same error, or runs without one)", exc_info=True)
        if pool is not None:
            pool.close()
        return None


def _worth_it(config: IngestConfig) -> bool:
    """Local parquet inputs only: planning reads their footers (a jsonl or csv input is read whole, and remote ones
    cost round trips: the plan would be made twice before any gain)."""
    from unirl_core.io import storage

    patterns = config.download_parquet.parquet_pattern
    return (
        config.download_images.enable
        and not config.download_parquet.copy_inputs
        and not storage.is_url(config.dataset_output_root)
        and not any(storage.is_url(p) or not p.endswith(".parquet") for p in patterns)
    )


def run_unit(root: str, unit: WorkUnit, config: IngestConfig, on_row: Callable[[int], None] | None = None) -> dict:
    """`download_unit` in the current `unit_processes` pool, or in this process outside one."""
    pool = _current.get()
    if pool is None:
        from unirl_core.ingest.download import download_unit

        return download_unit(root, unit, config, on_row=on_row)
    return pool.run_unit(root, unit, config, on_row)


# --- in the worker process ---

_queue = None


def _start_worker(caller: int, environ: dict, cwd: str, progress) -> None:
    global _queue
    threading.Thread(target=_exit_with, args=(caller,), name="watch-caller", daemon=True).start()
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    _queue = progress


def _exit_with(caller: int) -> None:
    """End this worker when the caller ends (killed included): an idle worker would wait on its task queue forever,
    and the forkserver stays while any worker does."""
    try:
        handle = os.pidfd_open(caller)
    except (AttributeError, OSError):  # not Linux >= 5.3: look every half second
        while _alive(caller):
            time.sleep(0.5)
    else:
        select.select([handle], [], [])  # readable once the caller has exited
    os._exit(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_unit(root: str, unit: WorkUnit, config: IngestConfig, token: int) -> dict:
    from unirl_core.ingest.download import download_unit  # preloaded by the forkserver

    sender = _ProgressSender(_queue, token)
    try:
        return download_unit(root, unit, config, on_row=sender, on_input_done=sender.input_done)
    finally:
        sender.close()


class _ProgressSender:
    """Rows done, sent to the caller at most every PROGRESS_EVERY_S (the first row at once, so a rate shows even
    for a unit done in one interval); `close` sends the rest and the end mark."""

    def __init__(self, queue, token: int):
        self.queue, self.token, self.pending, self.sent_at = queue, token, 0, float("-inf")

    def __call__(self, rows: int) -> None:
        self.pending += rows
        if time.monotonic() - self.sent_at >= PROGRESS_EVERY_S:
            self._send()

    def _send(self) -> None:
        if self.pending:
            self.queue.put(("rows", self.token, self.pending))
        self.pending, self.sent_at = 0, time.monotonic()

    def input_done(self) -> None:
        self.queue.put(("input_done", self.token, None))

    def close(self) -> None:
        self._send()
        self.queue.put(("end", self.token, None))
