"""Connect to or start a Ray cluster for one training round (the only room that imports ray).

`address` (or `RAY_ADDRESS`) joins an existing cluster (KubeRay, `ray start`); otherwise a local Ray is started on
127.0.0.1 without a dashboard (anyone who reaches a Ray dashboard/jobs port can run code, CVE-2023-48022) and shut
down when the block ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray


@contextmanager
def ray_cluster(
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    temp_dir: str | None = None,
    record: str | Path | None = None,
) -> Iterator[dict]:
    """Yield the cluster's resources; on exit disconnect (existing cluster) or shut the local Ray down.

    `record`: a JSON file listing the processes of a local Ray started here, so that a hook running in another
    process (Prefect's on_cancellation / on_crashed) can stop them with `stop_recorded` if this one was killed."""
    if ray.is_initialized():  # this process is already connected (a notebook, a test session): use it as is
        yield ray.cluster_resources()
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    else:
        ray.init(
            address="local",  # a new local Ray, never an existing `ray start` cluster found on this machine
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=temp_dir,
            logging_level="WARNING",
            log_to_driver=False,
        )
        if record:
            _record_processes(Path(record))
    try:
        yield ray.cluster_resources()
    finally:
        ray.shutdown()
        if record:
            Path(record).unlink(missing_ok=True)


def _record_processes(path: Path) -> None:
    import psutil

    me = psutil.Process()
    processes = [{"pid": p.pid, "create_time": p.create_time()} for p in me.children(recursive=True)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"driver": me.pid, "processes": processes}))


def stop_recorded(path: str | Path) -> int:
    """Kill the Ray processes listed in `path` (and their children) that still run; returns how many."""
    import psutil

    path = Path(path)
    if not path.is_file():
        return 0
    killed = 0
    for entry in json.loads(path.read_text())["processes"]:
        try:
            process = psutil.Process(entry["pid"])
            if abs(process.create_time() - entry["create_time"]) > 1:  # the pid was reused
                continue
            for child in [*process.children(recursive=True), process]:
                child.kill()
                killed += 1
        except psutil.NoSuchProcess:
            continue
    path.unlink(missing_ok=True)
    return killed
