"""A full or read-only output disk: `unirl ingest` fails in seconds, naming the path, with no temporaries left.

The output folder is a real tmpfs of 96 KiB (full after a few units) or a read-only one, mounted in a private
mount namespace (`unshare --user --map-root-user --mount`) around the command, so nothing on this machine is
touched. Where unprivileged namespaces are not allowed the test is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import shlex
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


def namespaces_allowed() -> bool:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


def ingest_on_tmpfs(tmp_path: Path, name: str, options: str, pattern: str, env: dict) -> tuple[int, str, float, str]:
    """`unirl ingest` with its output root on a tmpfs mounted with `options`; (exit code, stderr, seconds, what
    the tmpfs held afterwards: every path, one per line)."""
    root = tmp_path / name
    root.mkdir()
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(json.dumps({"ingest": {
        "dataset_output_root": str(root / "dataset"),
        "download_parquet": {"parquet_pattern": pattern, "rows_per_unit": 10},
        "download_images": {"allowed_private_networks": ["127.0.0.1/32"], "download_num_threads": 2,
                            "resize_mode": "keep_ratio", "image_size": 64},
    }}))  # fmt: skip
    listing = tmp_path / f"{name}.listing"
    script = (
        f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(root))} || exit 99; "
        f"{shlex.quote(UNIRL)} ingest {shlex.quote(str(recipe))}; code=$?; "
        f"find {shlex.quote(str(root))} > {shlex.quote(str(listing))}; exit $code"
    )
    started = time.monotonic()
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 99, done.stderr
    return done.returncode, done.stderr, time.monotonic() - started, listing.read_text()


def test_a_full_or_read_only_disk_fails_at_once_naming_the_path(prefect_harness, image_server, tmp_path):
    if not namespaces_allowed():
        pytest.skip("unprivileged user and mount namespaces are not allowed here: cannot mount a small tmpfs")
    from prefect.settings import PREFECT_API_URL

    rows = [{"url": image_server.add(f"/full/{i}.jpg", Route(body=cases.jpeg(96, 96, seed=i))),
             "caption": f"noise {i}"} for i in range(80)]  # fmt: skip
    pattern = str(tmp_path / "input.parquet")
    pq.write_table(pa.Table.from_pylist(rows), pattern)
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}

    code, stderr, seconds, listing = ingest_on_tmpfs(tmp_path, "full", "size=96k", pattern, env)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == stderr.splitlines()[-1:], stderr  # Prefect's own log lines come before it
    assert f"{tmp_path / 'full' / 'dataset'}/raw/" in errors[0] and "no space left on the device" in errors[0]
    assert "AwaitingRetry" not in stderr and "Retrying" not in stderr
    assert seconds < 60  # not retried: 3 attempts per unit with 5 and 30 s pauses took ~8 minutes
    assert "_stats.json" in listing  # the units before the disk filled are committed and kept
    assert ".tmp" not in listing, listing  # the failed unit's temporaries are gone although cleanup hit ENOSPC too

    code, stderr, seconds, listing = ingest_on_tmpfs(tmp_path, "readonly", "ro,size=96k", pattern, env)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and errors == stderr.splitlines()[-1:] and "read-only file system" in errors[0], stderr
    assert f"{tmp_path / 'readonly'}" in errors[0] and "Retrying" not in stderr and seconds < 60
