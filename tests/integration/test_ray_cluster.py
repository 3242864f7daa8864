"""Issue 15 (cluster-ready) on a real Ray: the placement deadline's error, the placement strategy, the workers'
environment, and a simulated two-node cluster (two raylets on this machine) joined by `train.ray.address`. Issue 20:
a local Ray listens on 127.0.0.1 only and keeps its session folders in the workspace."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

from unirl_core.distributed.rank import TorchWorker

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-token-51c9"
PUBLIC = "public-value-0d2e"


class EnvReader(TorchWorker):  # defined here: Ray pickles it by value
    def getenv(self, names: list[str]) -> dict:
        return {name: os.environ.get(name) for name in names}


def test_a_group_that_cannot_be_placed_fails_naming_the_resources(ray_local):
    import ray

    from unirl_core.distributed.worker_group import PlacementError, WorkerGroup

    with pytest.raises(PlacementError) as info:
        WorkerGroup(world_size=2, cpus_per_worker=8, ready_timeout_s=1)
    message = str(info.value)
    assert "within 1 s (train.ray.placement_timeout_s)" in message
    assert "asked 2 bundles of {CPU: 8} with strategy PACK ({CPU: 16} in all)" in message
    assert "available {CPU: 2} of {CPU: 2} on 1 node(s)" in message
    assert not isinstance(info.value, TimeoutError)  # rounds retry TimeoutErrors; this one is permanent
    assert ray.available_resources().get("CPU") == 2  # the pending placement group was removed


def test_the_placement_strategy_reaches_the_placement_group(ray_local):
    from ray.util.placement_group import placement_group_table

    from unirl_core.distributed.worker_group import WorkerGroup

    with WorkerGroup(world_size=1, strategy="SPREAD") as group:
        assert placement_group_table(group.placement_group)["strategy"] == "SPREAD"


def test_workers_get_the_forwarded_environment(ray_local, tmp_path):
    from unirl_core.config.schema import RayConfig
    from unirl_core.distributed.worker_env import worker_env
    from unirl_core.distributed.worker_group import WorkerGroup

    environ = {"UNIRL_HOME": str(tmp_path / "home"), "UNIRL_TEST_PUBLIC": PUBLIC, "SCORER_TOKEN": SECRET}
    env = worker_env(RayConfig(env_vars=["UNIRL_TEST_PUBLIC"]), ["SCORER_TOKEN"], environ)
    assert "SCORER_TOKEN" not in os.environ  # the worker's value comes from `env`, not from this process
    with WorkerGroup(world_size=1, worker_cls=EnvReader, env=env) as group:
        [seen] = group.run(EnvReader.getenv, list(environ))
    assert seen == environ


def test_two_raylets_on_this_machine_run_a_spread_group_with_the_forwarded_environment(tmp_path):
    """The simulated two-node cluster: STRICT_SPREAD puts one worker on each node, the group all-reduces over gloo
    across them, each worker has the forwarded variables, an impossible GPU ask is refused after connecting and
    before any actor, and the secrets' values are nowhere in Ray's logs or the driver's (the public one is, in
    Ray's runtime_env log: why secrets travel by call)."""
    root = Path(__file__).resolve().parents[2]
    temp_dir = tempfile.mkdtemp(prefix="ray2-", dir="/tmp")  # Ray's socket paths must stay short
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "UNIRL_HOME": str(tmp_path / "home"), "UNIRL_TEST_PUBLIC": PUBLIC, "UNIRL_TEST_SECRET": SECRET,
           "SCORER_TOKEN": "token-" + SECRET}  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    script = root / "tests/support/two_node_cluster.py"
    try:
        done = subprocess.run([sys.executable, str(script), temp_dir], env=env, capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)  # fmt: skip
        logged = {path: path.read_bytes() for path in Path(temp_dir).rglob("*") if path.is_file()}
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["strategy"] == "STRICT_SPREAD"
    assert len({rank["node"] for rank in answer["seen"]}) == 2  # one worker per node
    assert answer["all_reduce"] == [[2.0], [2.0]]
    expected = {"UNIRL_HOME": str(tmp_path / "home"), "UNIRL_TEST_PUBLIC": PUBLIC, "UNIRL_TEST_SECRET": SECRET,
                "SCORER_TOKEN": "token-" + SECRET}  # fmt: skip
    assert [rank["env"] for rank in answer["seen"]] == [expected, expected]
    assert "gpus_per_worker=1 asks for GPUs but the Ray cluster at" in answer["refused"]
    assert not [str(path) for path, data in logged.items() if SECRET.encode() in data]
    assert SECRET not in done.stderr  # the driver's logs (stdout is the workers' answer, values included)
    assert any(PUBLIC.encode() in data for data in logged.values())  # the search reaches where Ray logs values


def test_the_workers_of_a_local_ray_run_at_normal_priority(ray_local):
    """Ray's default nice 15 lets every other process of a busy node preempt the ranks (round_overhead.py)."""
    import ray

    @ray.remote(num_cpus=1)
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == 0


def test_a_local_ray_listens_on_loopback_only(ray_local):
    """The session's local Ray (started by `ray_cluster`): gcs_server, raylet, the agents, the workers and this
    driver listen on 127.0.0.1 alone (Ray would otherwise swap 127.0.0.1 for this machine's address)."""
    import ray

    assert ray.get(ray.remote(lambda: ray.util.get_node_ip_address()).remote()) == "127.0.0.1"
    me = psutil.Process()
    ray_pids = {p.pid for p in me.children(recursive=True) if "ray" in " ".join(p.cmdline())} | {me.pid}
    listening = [c for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in ray_pids]
    names = {psutil.Process(c.pid).name() for c in listening}
    assert {"gcs_server", "raylet"} <= names, names
    exposed = [(c.laddr, psutil.Process(c.pid).name()) for c in listening if not _loopback(c.laddr.ip)]
    assert not exposed


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def test_ray_keeps_its_session_folders_in_the_workspace_unless_the_path_is_too_long_for_its_sockets(
    tmp_path, monkeypatch, caplog
):
    from unirl_core.distributed.cluster import SOCKET_PATH_MAX, session_root

    short = tempfile.mkdtemp(prefix="ws-", dir="/tmp")
    try:
        monkeypatch.setenv("UNIRL_HOME", short)
        assert session_root() == f"{short}/ray"
    finally:
        shutil.rmtree(short, ignore_errors=True)
    long_home = tmp_path / ("w" * 60)
    monkeypatch.setenv("UNIRL_HOME", str(long_home))
    with caplog.at_level(logging.WARNING, logger="unirl_core.distributed.cluster"):
        root = session_root()
    try:
        assert root == session_root() and Path(root).is_dir()  # the same short folder for the same workspace
        assert len(f"{root}/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store.99") <= SOCKET_PATH_MAX
        assert f"not {long_home}/ray: that path is too long for Ray's unix sockets" in caplog.text
    finally:
        shutil.rmtree(root, ignore_errors=True)
