"""Connect to or start a Ray cluster for one training round (the only room that imports ray).

`address` (or `RAY_ADDRESS`) joins an existing cluster (KubeRay, `ray start`); otherwise a local Ray is started for
this machine alone and shut down when the block ends:
- every process of it listens on 127.0.0.1 only (gcs_server, raylet, the workers, the dashboard and runtime-env
  agents, the autoscaler's metrics), and there is no dashboard: anyone who reaches a Ray port can run code
  (CVE-2023-48022). A cluster other machines join is started with `ray start` and joined by `train.ray.address`.
- its workers run at the controller's priority (Ray's default is nice 15);
- its session folders (logs, sockets, spilled objects) are in the workspace, `$UNIRL_HOME/ray`, unless that path is
  too long for Ray's unix sockets or `RAY_TMPDIR` says otherwise (`session_root`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from unirl_core.workspace import workspace

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
SOCKET_PATH_MAX = 107  # bytes of a unix socket path (sun_path, 108 with its NUL), which Ray checks
# What Ray adds under its temp dir, at the longest: /session_<date>_<time>_<microseconds>_<pid>/sockets/<name>.<n>
SESSION_SOCKET_SUFFIX = len("/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store.99")


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
        with _node_address_kept_on_loopback():
            ray.init(
                address="local",  # a new local Ray, never an existing `ray start` cluster found on this machine
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                include_dashboard=False,
                _node_ip_address=LOOPBACK,
                _temp_dir=temp_dir or session_root(),
                # its start-up advice ("token authentication is enabled ...") is not news for a loopback cluster
                # this process owns; its warnings come back once it is up
                logging_level="ERROR",
                log_to_driver=False,
                # the ranks are the round's work: Ray runs workers at nice 15 by default, so on a busy node every
                # other process (the controller, Prefect, MLflow's sampling) preempts them
                _system_config={"worker_niceness": 0},
            )
        logging.getLogger("ray").setLevel(logging.WARNING)
        if record:
            _record_processes(Path(record))
    try:
        yield ray.cluster_resources()
    finally:
        ray.shutdown()
        if record:
            Path(record).unlink(missing_ok=True)


@contextmanager
def _node_address_kept_on_loopback() -> Iterator[None]:
    """Ray replaces a node address of 127.0.0.1 by this machine's own address ("remotely reachable") unless its
    multi-node support is off, which is its default on macOS and Windows only. With the address on 127.0.0.1, Ray's
    processes listen on it alone (its gRPC servers listen on all interfaces for any other node address)."""
    from ray._private import ray_constants

    enabled = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enabled


def session_root() -> str:
    """Where a local Ray keeps its session folders: `RAY_TMPDIR` when set (Ray's own setting), else `$UNIRL_HOME/ray`,
    or when the sockets under that would exceed what a unix socket path may hold, `<system temp dir>/unirl-ray-<hash
    of that path>` (a warning says so)."""
    if os.environ.get("RAY_TMPDIR"):
        return os.environ["RAY_TMPDIR"]
    root = workspace().root / "ray"
    if len(str(root).encode()) + SESSION_SOCKET_SUFFIX <= SOCKET_PATH_MAX:
        return str(root)
    short = Path(tempfile.gettempdir()) / f"unirl-ray-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"
    short.mkdir(mode=0o700, exist_ok=True)
    logger.warning(
        "Ray's session folders go to %s, not %s: that path is too long for Ray's unix sockets (%d bytes at most); "
        "a shorter UNIRL_HOME keeps them in the workspace",
        short, root, SOCKET_PATH_MAX,
    )  # fmt: skip
    return str(short)


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
