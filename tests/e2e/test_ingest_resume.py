"""SIGKILL `unirl ingest` mid-run, run it again: the result equals an uninterrupted run's, byte for byte."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import image_cases as cases
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from http_server import Route

pytestmark = pytest.mark.slow
UNIRL = str(Path(sys.executable).parent / "unirl")
ROWS, ROWS_PER_UNIT = 120, 10


def write_recipe(tmp_path: Path, root: Path, pattern: str) -> str:
    config = {
        "ingest": {
            "dataset_output_root": str(root),
            "download_parquet": {"parquet_pattern": pattern, "rows_per_unit": ROWS_PER_UNIT},
            "download_images": {
                "allowed_private_networks": ["127.0.0.1/32"],
                "download_num_processes": 1,
                "download_num_threads": 2,
                "resize_mode": "keep_ratio",
                "image_size": 48,
            },
            "reorganize_tar": {"tar_chunk_size": 16},
        }
    }
    path = tmp_path / f"{root.name}.yaml"
    path.write_text(json.dumps(config))
    return str(path)


def digests(root: Path) -> dict[str, str]:
    files = sorted((root / "shards").glob("*")) + sorted((root / "raw").glob("*.tar"))
    return {f"{p.parent.name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_sigkill_then_rerun_equals_an_uninterrupted_run(prefect_harness, image_server, tmp_path):
    from prefect.settings import PREFECT_API_URL

    rows = []
    for i in range(ROWS):
        route = Route(body=cases.jpeg(120, 90, seed=1000 + i), delay_s=0.02)
        rows.append({"url": image_server.add(f"/resume/{i}.jpg", route), "caption": f"resume {i}"})
    pattern = str(tmp_path / "input.parquet")
    pq.write_table(pa.Table.from_pylist(rows), pattern)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}

    killed_root = tmp_path / "killed"
    process = subprocess.Popen(
        [UNIRL, "ingest", write_recipe(tmp_path, killed_root, pattern)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while len(list((killed_root / "raw").glob("*_stats.json"))) < 3:
        assert process.poll() is None, "the run finished before it could be killed: slow the server down"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()

    committed = sorted(p.name for p in (killed_root / "raw").glob("*_stats.json"))
    assert 3 <= len(committed) < ROWS // ROWS_PER_UNIT
    assert not (killed_root / "shards").exists() or not list((killed_root / "shards").glob("*.tar"))
    fetched_before = dict(image_server.hits)

    resumed = subprocess.run(
        [UNIRL, "ingest", write_recipe(tmp_path, killed_root, pattern)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    for name in committed:  # committed units were not fetched again
        unit = int(name[:5])
        for row in range(unit * ROWS_PER_UNIT, (unit + 1) * ROWS_PER_UNIT):
            assert image_server.hits[f"/resume/{row}.jpg"] == fetched_before[f"/resume/{row}.jpg"] == 1

    clean_root = tmp_path / "clean"
    clean = subprocess.run(
        [UNIRL, "ingest", write_recipe(tmp_path, clean_root, pattern)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert clean.returncode == 0, clean.stderr[-2000:]
    assert digests(killed_root) == digests(clean_root)
    assert not list((killed_root / "raw").glob(".*.tmp"))  # leftovers of the kill were cleaned
    index = json.loads((killed_root / "shards" / "index.json").read_text())
    assert index["total_key_count"] == 112 and index["incomplete"] == ["00007.tar"]  # 120 = 7 x 16 + 8
    assert "samples_in_shards" in resumed.stdout and "112" in resumed.stdout
