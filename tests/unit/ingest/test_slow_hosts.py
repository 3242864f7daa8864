"""A slow or dead host holds up only its own row: later rows finish meanwhile, and the shard is written in input order.

Slowness is an Event the slow item waits on, never a sleep: the tests assert what happened while it was blocked.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import image_cases as cases
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest.download import download_unit, ordered_map
from unirl_core.ingest.plan import WorkUnit

WAIT_S = 20  # only reached when the behaviour is broken


class SlowFirst:
    """fn for ordered_map: item 0 blocks until `release`; `later_done` is set once `expected` later items returned."""

    def __init__(self, expected: int):
        self.release, self.later_done = threading.Event(), threading.Event()
        self.started: list[int] = []
        self.completed: list[int] = []
        self.expected = expected

    def __call__(self, item: int) -> int:
        self.started.append(item)
        if item == 0:
            assert self.release.wait(WAIT_S)
        self.completed.append(item)
        if len(self.completed) >= self.expected:
            self.later_done.set()
        return item * 10


def consume_in_background(results: list, *args) -> threading.Thread:
    consumer = threading.Thread(target=lambda: results.extend(ordered_map(*args)), daemon=True)
    consumer.start()
    return consumer


def test_later_items_finish_while_the_first_is_still_running():
    work, results = SlowFirst(expected=49), []
    with ThreadPoolExecutor(4) as pool:
        try:
            consumer = consume_in_background(results, pool, work, range(50), 8, 64)
            assert work.later_done.wait(WAIT_S), f"only {work.completed} finished while item 0 was running"
            assert 0 not in work.completed and results == []  # nothing is yielded before the oldest item
        finally:
            work.release.set()
        consumer.join(WAIT_S)
    assert results == [i * 10 for i in range(50)]


def test_a_slow_item_lets_at_most_max_ahead_items_start():
    work, results = SlowFirst(expected=15), []
    with ThreadPoolExecutor(4) as pool:
        try:
            consumer = consume_in_background(results, pool, work, range(100), 4, 16)
            assert work.later_done.wait(WAIT_S)
            assert sorted(work.started) == list(range(16))  # items 1-15 done and buffered; 16 waits for item 0
        finally:
            work.release.set()
        consumer.join(WAIT_S)
    assert results == [i * 10 for i in range(100)]


@pytest.fixture
def gated_server():
    """Loopback HTTP: /gate/* answers once `release` is set, every other path at once; `served` counts fast answers."""
    body, release, served, all_served = cases.jpeg(48, 32), threading.Event(), [], threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/gate/"):
                release.wait(WAIT_S)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            if not self.path.startswith("/gate/"):
                served.append(self.path)
                if len(served) == server.expected:
                    all_served.set()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads, server.release, server.all_served = True, release, all_served
    server.base = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    release.set()
    server.shutdown()
    server.server_close()


def unit_over(tmp_path, urls: list[str], root: str) -> tuple[IngestConfig, WorkUnit]:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"url": u, "caption": f"row {i}"} for i, u in enumerate(urls)]), path)
    config = IngestConfig.model_validate(
        {
            "dataset_output_root": str(tmp_path / root),
            "download_parquet": {"parquet_pattern": str(path)},
            "download_images": {"allowed_private_networks": ["127.0.0.1/32"], "download_num_threads": 2},
        }
    )
    return config, WorkUnit(0, str(path), 0, len(urls))


def test_a_slow_host_holds_up_only_its_row_and_the_shard_is_unchanged(tmp_path, gated_server):
    urls = [f"{gated_server.base}/gate/0.jpg"] + [f"{gated_server.base}/fast/{i}.jpg" for i in range(1, 17)]
    gated_server.expected = len(urls) - 1
    slow_config, unit = unit_over(tmp_path, urls, "slow")
    result = {}
    runner = threading.Thread(
        target=lambda: result.update(download_unit(slow_config.dataset_output_root, unit, slow_config))
    )
    runner.start()
    try:
        assert gated_server.all_served.wait(WAIT_S), "the rows behind a slow host waited for it"
    finally:
        gated_server.release.set()
    runner.join(WAIT_S)
    fast_config, _ = unit_over(tmp_path, urls, "fast")  # the same rows, the host no longer slow
    fast = download_unit(fast_config.dataset_output_root, unit, fast_config)
    assert result["successes"] == len(urls) and result["tar"] == fast["tar"]  # same bytes, same sha256
    records = pq.read_table(tmp_path / "slow" / "raw" / "00000.parquet").to_pylist()
    assert [r["source_row"] for r in records] == list(range(len(urls)))
