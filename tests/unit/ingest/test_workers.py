"""Work units in worker processes (unirl_core/ingest/workers.py): the same output as in this process, every row
reported, a worker's death a retryable error, errors and the caller's environment carried across, nothing left
running when the caller is killed, a unit started ahead run once."""

from __future__ import annotations

import errno
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing import forkserver
from pathlib import Path

import image_cases as cases
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from http_server import Route

from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest.budget import ErrorBudgetExceeded
from unirl_core.ingest.download import COMMITTED_NOW, download_unit
from unirl_core.ingest.plan import WorkUnit
from unirl_core.ingest.workers import WorkerDied, head_start, run_unit, unit_processes
from unirl_core.io.storage import StorageError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker processes fork from a forkserver (Linux)")
TIMING = ("duration", "start_time", "end_time")


def a_unit(tmp_path: Path, rows: list[dict], root: str, **download) -> tuple[IngestConfig, WorkUnit]:
    path = tmp_path / "in.parquet"
    schema = pa.schema([("url", pa.string()), ("img", pa.binary()), ("caption", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    config = IngestConfig.model_validate(
        {
            "dataset_output_root": root,
            "download_parquet": {"parquet_pattern": str(path)},
            "download_images": {"image_bytes_col": "img", "allowed_private_networks": ["127.0.0.1/32"],
                                "retries": 0, "error_budget": 1.0, **download},
        }
    )  # fmt: skip
    return config, WorkUnit(0, str(path), 0, len(rows))


def outputs(root: Path) -> tuple[bytes, bytes, dict]:
    import json

    stats = json.loads((root / "raw" / "00000_stats.json").read_text())
    timeless = {k: v for k, v in stats.items() if k not in TIMING}
    return (root / "raw" / "00000.tar").read_bytes(), (root / "raw" / "00000.parquet").read_bytes(), timeless


def mixed_rows(image_server, count: int = 12) -> list[dict]:
    rows = []
    for i in range(count):
        data = cases.jpeg(40 + i, 30 + i)
        if i % 3 == 0:
            rows.append({"url": image_server.add(f"/workers/{i}.jpg", data), "img": None, "caption": f"url {i}"})
        else:
            rows.append({"url": None, "img": data, "caption": f"bytes {i}"})
    rows.append({"url": None, "img": cases.HTML, "caption": "not an image"})
    return rows


def slow_rows(image_server, name: str, count: int, delay_s: float) -> list[dict]:
    """`count` rows whose images the server sends after `delay_s` each: a unit that runs a while."""
    route = Route(cases.jpeg(32, 24), delay_s=delay_s)
    return [
        {"url": image_server.add(f"/workers/{name}/{i}.jpg", route), "img": None, "caption": f"{name} {i}"}
        for i in range(count)
    ]


def test_a_unit_in_a_worker_process_writes_the_same_bytes_and_reports_every_row(tmp_path, image_server, monkeypatch):
    rows = mixed_rows(image_server)
    here, unit = a_unit(tmp_path, rows, str(tmp_path / "here"))
    download_unit(here.dataset_output_root, unit, here)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("UNIRL_TEST_MARK", "set after the forkserver started")
    there, _ = a_unit(tmp_path, rows, "there")  # relative: the worker works in the caller's directory
    reported, descendants = [], set()

    def on_row(n: int) -> None:
        reported.append(n)
        descendants.update(p.pid for p in psutil.Process().children(recursive=True))

    with unit_processes(1):
        stats = run_unit(there.dataset_output_root, unit, there, on_row=on_row)
    assert outputs(tmp_path / "there") == outputs(tmp_path / "here")
    assert stats["count"] == len(rows) and stats["successes"] == len(rows) - 1
    assert sum(reported) == len(rows)  # every row reported before run_unit returned
    assert descendants, "the unit did not run in a worker process"


def test_a_worker_that_dies_fails_its_unit_with_a_retryable_error_and_the_next_run_succeeds(tmp_path, image_server):
    rows = slow_rows(image_server, "slow", 12, delay_s=0.3)
    config, unit = a_unit(tmp_path, rows, str(tmp_path / "ds"), download_num_threads=2)
    errors, started = [], threading.Event()
    with unit_processes(1) as pool:

        def first_try():
            try:
                pool.run_unit(config.dataset_output_root, unit, config, on_row=lambda n: started.set())
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                errors.append(exc)

        thread = threading.Thread(target=first_try)
        thread.start()
        assert started.wait(30), "the unit never reported a row"
        workers = psutil.Process(forkserver._forkserver._forkserver_pid).children()
        assert workers
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], WorkerDied), errors
        assert "unit 00000" in str(errors[0]) and not isinstance(errors[0], ErrorBudgetExceeded)
        assert not (tmp_path / "ds" / "raw" / "00000_stats.json").exists()  # nothing committed by the dead worker
        stats = pool.run_unit(config.dataset_output_root, unit, config, None)  # a fresh worker takes it
    assert stats["successes"] == 12
    assert not [p.name for p in (tmp_path / "ds" / "raw").iterdir() if p.name.endswith(".tmp")]


def test_errors_arrive_from_the_worker_as_they_were_raised(tmp_path):
    rows = [{"url": None, "img": cases.HTML, "caption": f"bad {i}"} for i in range(4)]
    config, unit = a_unit(tmp_path, rows, str(tmp_path / "ds"), error_budget=0.5, error_budget_min_rows=1)
    with unit_processes(1), pytest.raises(ErrorBudgetExceeded, match="unit 00000.*decode_error"):
        run_unit(config.dataset_output_root, unit, config)
    full = pickle.loads(pickle.dumps(StorageError(errno.ENOSPC, "/data/raw/00000.tar", "cannot write")))
    assert isinstance(full, StorageError) and full.errno == errno.ENOSPC
    assert str(full).startswith("/data/raw/00000.tar: cannot write: no space left")


def test_worker_processes_die_with_a_killed_caller(tmp_path, image_server):
    rows = slow_rows(image_server, "slower", 40, delay_s=1.0)
    config, unit = a_unit(tmp_path, rows, str(tmp_path / "ds"), download_num_threads=2)
    script = textwrap.dedent(
        f"""
        import sys
        from unirl_core.config.ingest import IngestConfig
        from unirl_core.ingest.plan import WorkUnit
        from unirl_core.ingest.workers import run_unit, unit_processes
        config = IngestConfig.model_validate_json({config.model_dump_json()!r})
        unit = WorkUnit(0, {unit.file!r}, 0, {len(rows)})
        with unit_processes(2):
            run_unit(config.dataset_output_root, unit, config, on_row=lambda n: print("row", flush=True))
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert caller.stdout.readline().startswith("row")  # a worker is fetching
        started = psutil.Process(caller.pid).children(recursive=True)
        assert len(started) >= 2  # the forkserver and the worker (and multiprocessing's resource tracker)
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 10
    while [p for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = [" ".join(p.cmdline()) for p in started if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, alive
    assert os.path.exists(tmp_path / "ds" / "raw") and not (tmp_path / "ds" / "raw" / "00000_stats.json").exists()


def test_the_next_unit_starts_while_a_unit_waits_for_its_last_slow_row(tmp_path, image_server):
    """One process's turn: unit 0 ends with a row that takes 2 s (a slow host); unit 1 starts as soon as every row of
    unit 0 has started, not when its slow row has finished, and never while unit 0 still takes rows."""
    from datetime import datetime

    rows = [{"url": None, "img": cases.jpeg(32 + i, 24), "caption": f"fast {i}"} for i in range(8)]
    rows.append({"url": image_server.add("/workers/last-slow.jpg", Route(cases.jpeg(32, 24), delay_s=2.0)),
                 "img": None, "caption": "slow"})  # fmt: skip
    config, _ = a_unit(tmp_path, rows + rows, str(tmp_path / "ds"), download_num_threads=2)
    path = str(tmp_path / "in.parquet")
    units = [WorkUnit(0, path, 0, 9), WorkUnit(1, path, 9, 18)]
    results = {}
    with unit_processes(1) as pool:
        assert pool.max_units == 2
        threads = [
            threading.Thread(target=lambda u=u: results.setdefault(u.index, pool.run_unit(config.dataset_output_root, u, config, None)))
            for u in units
        ]  # fmt: skip
        for thread in threads:
            thread.start()
            time.sleep(0.2)  # unit 0 asks for its turn first
        for thread in threads:
            thread.join(60)
    first, second = (results[i] for i in (0, 1))
    assert first["successes"] == second["successes"] == 9
    start = {i: datetime.fromisoformat(results[i]["start_time"]) for i in (0, 1)}
    end = {i: datetime.fromisoformat(results[i]["end_time"]) for i in (0, 1)}
    assert start[1] < end[0], "unit 1 waited for unit 0's slow row"
    assert (start[1] - start[0]).total_seconds() > 0.1  # ... but not for its turn: unit 0 took its rows first


@pytest.mark.parametrize("ask", ["while it runs", "once it is committed"])
def test_a_unit_started_ahead_runs_once_and_hands_its_rows_to_whoever_asks_for_it(tmp_path, image_server, ask):
    """`start` runs the unit before anyone asks for it (`unirl ingest` does so while it imports Prefect); the later
    `run_unit` waits for that run instead of running the unit again, and gets every row: those reported before it
    asked, and the rest as they come."""
    rows = mixed_rows(image_server) + slow_rows(image_server, f"ahead-{ask[0]}", 6, delay_s=0.5)
    config, unit = a_unit(tmp_path, rows, str(tmp_path / "ds"), download_num_threads=2)  # its slow rows: >= 1.5 s
    stats_file = tmp_path / "ds" / "raw" / "00000_stats.json"
    reported = []
    with unit_processes(1) as pool:
        pool.start(config.dataset_output_root, [unit], config)
        deadline = time.monotonic() + 30
        while ask == "once it is committed" and not stats_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats_file.exists() == (ask == "once it is committed")
        stats = pool.run_unit(config.dataset_output_root, unit, config, on_row=reported.append)
    assert stats[COMMITTED_NOW]  # the started run's result: a second run would find the unit committed (no mark)
    assert sum(reported) == len(rows)
    assert outputs(tmp_path / "ds")[2]["successes"] == len(rows) - 1


def test_units_started_ahead_and_never_asked_for_stop_when_the_head_start_ends(tmp_path, image_server):
    """The flow failed before its downloads (its API unreachable, say): the units `head_start` started are stopped
    with the command, not left running until they commit."""
    rows = slow_rows(image_server, "never-asked", 20, delay_s=1.0)
    config, _ = a_unit(tmp_path, rows, str(tmp_path / "ds"), download_num_threads=2)  # ~10 s of rows
    workers: list[psutil.Process] = []
    with pytest.raises(RuntimeError, match="before its downloads"), head_start(config):
        deadline = time.monotonic() + 30
        while not workers and time.monotonic() < deadline:
            time.sleep(0.05)
            workers = psutil.Process(forkserver._forkserver._forkserver_pid).children()
        assert workers, "no unit started ahead"
        raise RuntimeError("the flow failed before its downloads")
    deadline = time.monotonic() + 5
    while [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    assert not (tmp_path / "ds" / "raw" / "00000_stats.json").exists()
