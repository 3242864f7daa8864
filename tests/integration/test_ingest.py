"""The ingest flow end to end on real Prefect, a loopback image server, local folders and moto's S3."""

from __future__ import annotations

import hashlib
import json
import pickle
import time
from datetime import datetime
from pathlib import Path

import image_cases as cases
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from http_server import Route
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest.budget import ErrorBudgetExceeded
from unirl_core.ingest.plan import IngestInputError
from unirl_core.summaries import IngestSummary

pytestmark = pytest.mark.slow

# row -> expected skip reason (None: a sample), in input order
BAD_ROWS = [
    ("/bad/404.jpg", None, "failed_to_download"),
    ("/bad/500.jpg", Route(status=500), "failed_to_download"),
    ("/bad/bomb.png", Route(body=cases.decompression_bomb(), content_type="image/png"), "too_many_pixels"),
    ("/bad/truncated.jpg", cases.truncated_jpeg(), "decode_error"),
    ("/bad/page.jpg", Route(body=cases.HTML, content_type="text/html"), "decode_error"),
    ("/bad/empty.jpg", b"", "decode_error"),
    ("/bad/huge.jpg", Route(endless=True), "too_large"),
    ("/bad/to-metadata", Route(status=302, location="http://169.254.169.254/latest/meta-data/"), "blocked_address"),
]


def write_parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=7)
    return str(path)


def good_rows(server, count: int, offset: int = 0) -> list[dict]:
    rows = []
    for i in range(offset, offset + count):
        url = server.add(f"/ok/{i}.jpg", cases.jpeg(240 + 7 * (i % 9), 180 + 5 * (i % 7), seed=i))
        rows.append({"url": url, "caption": f"procedural image {i}", "image": None, "source": "web"})
    return rows


def mixed_rows(server) -> tuple[list[dict], list]:
    rows, expected = good_rows(server, 30), [None] * 30
    for path, route, reason in BAD_ROWS:
        url = server.base + path if route is None else server.add(path, route)
        rows.append({"url": url, "caption": f"bad {path}", "image": None, "source": "web"})
        expected.append(reason)
    extra = [
        ({"url": None, "caption": "bytes only", "image": cases.jpeg(seed=101), "source": "bytes"}, None),
        ({"url": server.base + "/ok/0.jpg", "caption": "both", "image": cases.jpeg(seed=102), "source": "x"}, None),
        ({"url": None, "caption": "neither", "image": None, "source": "none"}, "no_image"),
        ({"url": "file:///etc/passwd", "caption": "local", "image": None, "source": "x"}, "blocked_scheme"),
        ({"url": server.base + "/ok/1.jpg", "caption": None, "image": None, "source": "null caption"}, None),
        ({"url": server.base + "/ok/2.jpg", "caption": "x" * 70_000, "image": None, "source": "huge"}, "bad_caption"),
        (
            {
                "url": server.add("/exif6.jpg", cases.exif_rotated(6)),
                "caption": "rotated",
                "image": None,
                "source": "x",
            },
            None,
        ),
        ({"url": server.add("/cmyk.jpg", cases.cmyk_jpeg()), "caption": "cmyk", "image": None, "source": "x"}, None),
        (
            {
                "url": server.add("/pal.png", cases.palette_with_transparency()),
                "caption": "p",
                "image": None,
                "source": "x",
            },
            None,
        ),
        ({"url": server.add("/anim.gif", cases.animated_gif()), "caption": "gif", "image": None, "source": "x"}, None),
    ]
    rows += [r for r, _ in extra]
    expected += [e for _, e in extra]
    return rows, expected


def recipe(tmp_path: Path, root: str, pattern: str, rows_per_unit: int = 20, **images) -> str:
    config = {
        "ingest": {
            "dataset_output_root": root,
            "download_parquet": {"parquet_pattern": pattern, "rows_per_unit": rows_per_unit},
            "download_images": {
                "image_bytes_col": "image",
                "save_additional_columns": ["source"],
                "allowed_private_networks": ["127.0.0.1/32"],
                "retries": 1,
                "retry_backoff_s": 0.01,
                "read_timeout_s": 2,
                "max_bytes": 200_000,
                "resize_mode": "center_crop",
                "image_size": 64,
                "download_num_threads": 4,
                **images,
            },
            "reorganize_tar": {"tar_chunk_size": 8},
        }
    }
    path = tmp_path / f"recipe-{hashlib.md5(root.encode()).hexdigest()[:6]}.json.yaml"
    path.write_text(json.dumps(config))
    return str(path)


def run_ingest(recipe_path: str) -> IngestSummary:
    """What `unirl ingest RECIPE` does, in-process (the console script itself is run in tests/e2e: Prefect's log
    handler keeps the first stream it sees, so a second in-process CliRunner invocation cannot be used)."""
    from flows.ingest import ingest
    from unirl_core.config import load_recipe

    return ingest(load_recipe(recipe_path).ingest)


def digests(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.iterdir())
        if not p.name.startswith(".")
    }


def test_ingest_accounts_for_every_row_and_writes_equal_shards(prefect_harness, image_server, tmp_path):
    rows, expected = mixed_rows(image_server)
    pattern = write_parquet(tmp_path / "mixed.parquet", rows)
    root = tmp_path / "dataset"
    result = run_ingest(recipe(tmp_path, str(root), pattern))

    # every input row is accounted for, with the reason we expect
    records = pa.concat_tables([pq.read_table(p) for p in sorted((root / "raw").glob("*.parquet"))]).to_pylist()
    assert len(records) == len(rows)
    assert [r["skip_reason"] for r in records] == expected
    assert {r["status"] for r in records} == {"success", "failed_to_download", "failed_to_resize"}
    ok = expected.count(None)

    # shards of exactly tar_chunk_size, the tail marked, the index and wdinfo consistent
    shards = root / "shards"
    index = json.loads((shards / "index.json").read_text())
    wdinfo = pickle.loads((shards / "wdinfo.pkl").read_bytes())
    assert wdinfo == {
        "tar_files": [s["url"] for s in index["shardlist"]],
        "chunk_size": 8,
        "total_key_count": 8 * (ok // 8),
    }
    assert all(s["nsamples"] == 8 for s in index["shardlist"])
    tail = f"{ok // 8:05d}.tar"
    assert index["incomplete"] == [tail] and (shards / f"{tail}.INCOMPLETE").exists()

    summary = CliRunner().invoke(app, ["shards", "inspect", str(root), "--samples", "3"])
    assert summary.exit_code == 0, summary.output
    head, *samples = [json.loads(line) for line in summary.stdout.splitlines()]
    assert head["rows"] == len(rows) and head["samples"] == 8 * (ok // 8)
    assert sum(head["skip_reasons"].values()) == len(rows) - ok
    assert len(samples) == 3 and samples[0]["image"] == {"format": "jpg", "width": 64, "height": 64}
    assert samples[0]["caption"] == "procedural image 0" and samples[0]["metadata"]["source"] == "web"
    assert result.rows == len(rows) and result.ok == ok and result.skip_reasons["decode_error"] == 3


def test_rerun_is_a_no_op_and_two_runs_are_byte_identical(prefect_harness, image_server, tmp_path):
    pattern = write_parquet(tmp_path / "good.parquet", good_rows(image_server, 45, offset=200))
    first, second = tmp_path / "a", tmp_path / "b"
    run_ingest(recipe(tmp_path, str(first), pattern))
    hits = sum(image_server.hits.values())
    before = digests(first / "shards")
    run_ingest(recipe(tmp_path, str(first), pattern))
    assert sum(image_server.hits.values()) == hits  # committed units were skipped: nothing fetched again
    assert digests(first / "shards") == before
    run_ingest(recipe(tmp_path, str(second), pattern))
    assert digests(second / "shards") == before
    assert digests(second / "raw").keys() == digests(first / "raw").keys()


def test_new_input_files_append_units_and_keep_full_shards(prefect_harness, image_server, tmp_path):
    (tmp_path / "in").mkdir()
    write_parquet(tmp_path / "in" / "a.parquet", good_rows(image_server, 20, offset=300))
    root = tmp_path / "ds"
    config = recipe(tmp_path, str(root), str(tmp_path / "in" / "*.parquet"))
    run_ingest(config)
    before = digests(root / "shards")
    write_parquet(tmp_path / "in" / "0-earlier-name.parquet", good_rows(image_server, 10, offset=400))
    run_ingest(config)
    after = digests(root / "shards")
    assert after["00000.tar"] == before["00000.tar"] and after["00001.tar"] == before["00001.tar"]
    assert json.loads((root / "shards" / "index.json").read_text())["total_key_count"] == 24


def missing_rows(server, count: int) -> list[dict]:
    return [
        {"url": server.base + f"/bad/missing-{i}.jpg", "caption": "x", "image": None, "source": "x"}
        for i in range(count)
    ]


def test_error_budget_fails_the_run_with_the_histogram(prefect_harness, image_server, tmp_path):
    pattern = write_parquet(
        tmp_path / "mostly-bad.parquet", good_rows(image_server, 3, offset=500) + missing_rows(image_server, 7)
    )
    histogram = "7 of 10 rows skipped (70% > error_budget 50%); reasons: failed_to_download: 7"

    # a unit of error_budget_min_rows rows or more is judged alone, and fails before it is committed
    with pytest.raises(ErrorBudgetExceeded, match="unit 00000") as info:
        run_ingest(recipe(tmp_path, str(tmp_path / "early"), pattern, error_budget_min_rows=10))
    assert histogram in str(info.value)
    assert not list((tmp_path / "early" / "raw").glob("*_stats.json"))  # nothing committed
    assert not list((tmp_path / "early" / "raw").glob("*.tar"))

    # a smaller unit is committed; the dataset as a whole is judged before any shard is written
    with pytest.raises(ErrorBudgetExceeded, match="dataset") as info:
        run_ingest(recipe(tmp_path, str(tmp_path / "whole"), pattern))
    assert histogram in str(info.value)
    assert [p.name for p in (tmp_path / "whole" / "raw").glob("*_stats.json")] == ["00000_stats.json"]
    assert not (tmp_path / "whole" / "shards").exists()


def test_a_small_last_unit_does_not_fail_a_good_dataset(prefect_harness, image_server, tmp_path):
    """Units of 20 judged alone (error_budget_min_rows 10); the last unit is 2 rows, both 404s: 100% of a tiny
    unit, 2 of 42 rows of the dataset."""
    pattern = write_parquet(
        tmp_path / "tail.parquet", good_rows(image_server, 40, offset=900) + missing_rows(image_server, 2)
    )
    root = tmp_path / "ds"
    summary = run_ingest(recipe(tmp_path, str(root), pattern, error_budget_min_rows=10))
    assert (summary.rows, summary.ok, summary.skip_reasons) == (42, 40, {"failed_to_download": 2})
    assert summary.samples_in_shards == 40 and summary.units == 3
    tail = json.loads((root / "raw" / "00002_stats.json").read_text())
    assert (tail["count"], tail["successes"], tail["skip_reasons"]) == (2, 0, {"failed_to_download": 2})


def empty_parquet(path: Path) -> None:
    pq.write_table(pa.table({"url": pa.array([], pa.string()), "caption": pa.array([], pa.string())}), path)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda p: write_parquet(p, [{"link": "http://x/a.jpg", "caption": "a"}]),
            "column 'url' (download_images.url_col) is missing",
        ),
        (
            lambda p: write_parquet(p, [{"url": 3, "caption": "a"}]),
            "column 'url' (download_images.url_col) has type int64",
        ),
        (empty_parquet, "the file has no rows"),
        (lambda p: p.write_bytes(b"PAR1 this is not parquet"), "not a readable parquet file"),
    ],
)
def test_bad_inputs_fail_before_any_download(prefect_harness, image_server, tmp_path, make, message):
    path = tmp_path / "input.parquet"
    make(path)
    hits = sum(image_server.hits.values())
    with pytest.raises(IngestInputError) as info:
        run_ingest(recipe(tmp_path, str(tmp_path / "ds"), str(path), image_bytes_col=None, save_additional_columns=[]))
    assert message in str(info.value) and str(path) in str(info.value)
    assert sum(image_server.hits.values()) == hits
    assert not (tmp_path / "ds" / "raw").exists()


def test_changed_output_settings_fail_before_any_download(prefect_harness, image_server, tmp_path):
    """A re-run with another output setting (image_size) and a new input: the committed units' settings differ, so
    the run fails before fetching a row of the new input (its units would mix two settings in one dataset)."""
    (tmp_path / "in").mkdir()
    write_parquet(tmp_path / "in" / "a.parquet", good_rows(image_server, 10, offset=1000))
    root, pattern = str(tmp_path / "ds"), str(tmp_path / "in" / "*.parquet")
    run_ingest(recipe(tmp_path, root, pattern))
    write_parquet(tmp_path / "in" / "b.parquet", good_rows(image_server, 10, offset=1100))
    hits = sum(image_server.hits.values())
    with pytest.raises(IngestInputError, match="was committed for .* with settings"):
        run_ingest(recipe(tmp_path, root, pattern, image_size=32))
    assert sum(image_server.hits.values()) == hits
    assert sorted(p.name for p in (tmp_path / "ds" / "raw").glob("*_stats.json")) == ["00000_stats.json"]


def test_wdinfo_loads_the_way_nemo_loads_it(prefect_harness, image_server, tmp_path):
    import webdataset as wds

    pattern = write_parquet(tmp_path / "nemo.parquet", good_rows(image_server, 20, offset=600))
    root = tmp_path / "ds"
    run_ingest(recipe(tmp_path, str(root), pattern))
    wdinfo_path = root / "shards" / "wdinfo.pkl"
    with open(wdinfo_path, "rb") as f:  # NeMo: pickle.load, then tar_files relative to the wdinfo folder
        info = pickle.load(f)
    urls = [str(wdinfo_path.parent / name) for name in info["tar_files"]]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    assert len(samples) == info["total_key_count"] == 16
    assert all({"jpg", "txt", "json"} <= set(s) for s in samples)
    assert [s["__key__"] for s in samples] == sorted(s["__key__"] for s in samples)


def test_s3_round_trip(prefect_harness, image_server, s3_endpoint, tmp_path):
    import fsspec

    local = write_parquet(tmp_path / "s3in.parquet", good_rows(image_server, 12, offset=700))
    fs = fsspec.filesystem("s3")
    fs.put_file(local, "unirl-test/inputs/part-0.parquet")
    root = "s3://unirl-test/datasets/s3-demo"
    assert run_ingest(recipe(tmp_path, root, "s3://unirl-test/inputs/*.parquet")).ok == 12
    listing = sorted(p.rsplit("/", 1)[-1] for p in fs.ls("unirl-test/datasets/s3-demo/shards"))
    assert listing == ["00000.tar", "00001.tar", "00001.tar.INCOMPLETE", "_reorganize.json", "index.json", "wdinfo.pkl"]
    inspect = CliRunner().invoke(app, ["shards", "inspect", root, "--samples", "1"])
    assert inspect.exit_code == 0, inspect.output
    head, sample = [json.loads(line) for line in inspect.stdout.splitlines()]
    assert head["samples"] == 8 and head["rows"] == 12 and sample["key"] == "000000000"


def test_ingest_flow_publishes_artifacts_and_an_event(prefect_harness, image_server, tmp_path):
    from datetime import UTC, datetime, timedelta

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter

    from flows.ingest import ingest

    started = datetime.now(UTC)

    pattern = write_parquet(tmp_path / "ev.parquet", good_rows(image_server, 9, offset=800))
    config = IngestConfig.model_validate(
        json.loads(Path(recipe(tmp_path, str(tmp_path / "ds"), pattern)).read_text())["ingest"]
    )
    summary = ingest(config)
    assert (
        isinstance(summary, IngestSummary) and IngestSummary.model_validate_json(summary.model_dump_json()) == summary
    )
    assert summary.ok == 9 and summary.shards == 1 and summary.samples_in_shards == 8
    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["ingest"])),
                                        sort=FlowRunSort.START_TIME_DESC, limit=1)  # fmt: skip
        assert run.state.data is None  # the summary lives in memory: no result (pickle or otherwise) is written
        artifacts = {a.key: a for a in client.read_latest_artifacts()}
        event_filter = EventFilter(
            event=EventNameFilter(name=["unirl.dataset.updated"]),
            occurred=EventOccurredFilter(since=started, until=started + timedelta(minutes=10)),
        )
        deadline = time.monotonic() + 30
        while not (events := client.read_events(filter=event_filter, limit=50).events) and time.monotonic() < deadline:
            time.sleep(0.5)  # events reach the API asynchronously
    assert "ingest-summary" in artifacts and artifacts["ingest-progress"].data == 100.0
    payloads = [e.payload for e in events if e.payload.get("dataset") == config.dataset_output_root]
    assert payloads and payloads[0]["ok"] == 9 and payloads[0]["samples_in_shards"] == 8
    assert summary.new_units == 1

    again = ingest(config)  # nothing new: no event, or the retrain deployment would trigger itself forever
    assert again.new_units == 0 and again.ok == 9

    # a run killed after its units committed (or whose head start committed them before its flow failed): the next
    # run commits no unit, but publishes the dataset for the first time, so the event comes
    from unirl_core.ingest.stages import download_unit, stage_download_parquet

    killed = config.model_copy(update={"dataset_output_root": str(tmp_path / "killed")})
    for unit in stage_download_parquet(killed):
        download_unit(killed.dataset_output_root, unit, killed)
    recovered = ingest(killed)
    assert recovered.new_units == 0 and recovered.samples_in_shards == 8

    deadline, seen = time.monotonic() + 30, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline and not seen:
            events = client.read_events(filter=event_filter, limit=50).events
            seen = [e for e in events if e.payload.get("dataset") == killed.dataset_output_root]
            time.sleep(0.5)
    assert len(seen) == 1
    assert len([e for e in events if e.payload.get("dataset") == config.dataset_output_root]) == 1


def test_a_head_start_runs_every_unit_once_and_writes_the_same_bytes(prefect_harness, image_server, tmp_path):
    """`unirl ingest` commits the plan and starts the first units before it imports Prefect (workers.head_start);
    the flow's tasks take the running (here: finished) units: no row is fetched twice, the bytes are those of a plain
    run, and the summary counts the units and their time as this run's (the `dataset.updated` event depends on it)."""
    from flows.ingest import ingest
    from unirl_core.config import load_recipe
    from unirl_core.ingest.workers import head_start

    slow = Route(cases.jpeg(200, 150, seed=7), delay_s=1.0)
    rows = good_rows(image_server, 30, offset=900) + [
        {"url": image_server.add(f"/head/{i}.jpg", slow), "caption": "slow", "image": None, "source": "web"}
        for i in range(8)
    ]  # units of 20 and 18 rows, the second with 8 rows of 1 s: 2 s at 4 threads
    pattern = write_parquet(tmp_path / "head.parquet", rows)
    plain, ahead = tmp_path / "plain", tmp_path / "ahead"
    before = sum(image_server.hits.values())
    run_ingest(recipe(tmp_path, str(plain), pattern, download_num_processes=2))
    fetched = sum(image_server.hits.values())
    config = load_recipe(recipe(tmp_path, str(ahead), pattern, download_num_processes=2)).ingest
    with head_start(config):
        assert (ahead / "units.json").exists()  # the plan is committed before any unit starts, as the flow does it
        deadline = time.monotonic() + 60
        while len(list((ahead / "raw").glob("*_stats.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list((ahead / "raw").glob("*_stats.json"))) == 2, "the units did not start before the flow"
        flow_called = time.time()
        summary = ingest(config)
    assert sum(image_server.hits.values()) - fetched == fetched - before == len(rows)  # once by each run
    assert digests(ahead / "shards") == digests(plain / "shards")
    assert digests(ahead / "raw").keys() == digests(plain / "raw").keys()
    assert summary.new_units == 2 and summary.rows == len(rows) and summary.ok == len(rows)
    first_start = min(json.loads(p.read_text())["start_time"] for p in (ahead / "raw").glob("*_stats.json"))
    assert summary.seconds >= flow_called - datetime.fromisoformat(first_start).timestamp()  # from the head start
