"""Shared fixtures: real services, started once per session, torn down at the end.

| fixture          | what it is                                                             | scope   |
|------------------|------------------------------------------------------------------------|---------|
| prefect_harness  | Prefect's test harness: a temporary database and ephemeral API server  | session |
| ray_local        | a local Ray (2 CPUs, no dashboard, no token auth, own temp dir)        | session |
| mlflow_uri       | MLFLOW_TRACKING_URI pointing at a sqlite file in a temp folder          | test    |
| tiny_model       | a tiny diffusers pipeline folder per family (sd3, sd15), built once    | session |
| s3_endpoint      | moto's threaded S3 server on 127.0.0.1 with a bucket, dummy credentials | session |
| image_server     | a loopback HTTP server serving images, errors, redirects, slow bodies   | session |

Nothing here downloads anything: HF_HUB_OFFLINE is set before any library is imported, and in the test process a
connection to any non-loopback address raises.
"""

from __future__ import annotations

import os
import tempfile

# Set before prefect/ray/mlflow/transformers are imported by any test module.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # Prefect server telemetry: not DO_NOT_TRACK
os.environ["UNIRL_HOME"] = tempfile.mkdtemp(prefix="unirl-home-")
# One Prefect database per test worker, migrated by the first temporary server: `unirl` keeps one per workspace
# (flows/console.workspace_prefect_database), and a fresh one per test's workspace costs its migrations every time.
os.environ.setdefault(
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
    f"sqlite+aiosqlite:///{tempfile.mkdtemp(prefix='unirl-prefect-')}/prefect.db",
)

import ipaddress  # noqa: E402
import socket  # noqa: E402

import pytest  # noqa: E402

_connect = socket.socket.connect


def _loopback_only(self, address):
    """No test reaches beyond this machine: a connection to a non-loopback address fails loudly."""
    if self.family in (socket.AF_INET, socket.AF_INET6):
        host = address[0]
        if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
            raise RuntimeError(f"a test tried to reach {address}: tests never download anything")
    return _connect(self, address)


socket.socket.connect = _loopback_only


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's harness, started again (at most twice) when its server's start-up health check is answered with a
    reset connection: Prefect 3.8.8's start() retries a refused connection only, and a port it picked can be taken
    by another process (a Ray worker, another test's server) before its own server binds it (CI lost one worker's
    36 Prefect tests to one such reset)."""
    import httpx
    import prefect.main  # noqa: F401  (its logging handlers bind the streams of now, not of a CliRunner invocation)
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.testing.utilities import prefect_test_harness

    for attempt in range(3):
        harness = prefect_test_harness(server_startup_timeout=120)
        try:
            harness.__enter__()
            break
        except (httpx.ReadError, httpx.RemoteProtocolError):
            server = SubprocessASGIServer._instances.pop(None, None)
            if server is not None and server.server_process is not None:
                server.server_process.kill()
            if attempt == 2:
                raise
    try:
        yield
    finally:
        harness.__exit__(None, None, None)


@pytest.fixture(scope="session")
def ray_local():
    from unirl_core.distributed.cluster import ray_cluster

    # A short temp path: Ray's unix socket paths must stay under 107 characters.
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    with ray_cluster(num_cpus=2, temp_dir=temp_dir) as resources:
        yield resources


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("UNIRL_HOME", str(tmp_path / "home"))
    return uri


@pytest.fixture(scope="session", params=["sd3", "sd15"])
def tiny_model(request, tmp_path_factory):
    from unirl_core.models.registry import write_tiny_model

    family = request.param
    return family, write_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}") / "pipeline", family, seed=0)


@pytest.fixture(scope="session")
def s3_endpoint():
    """An S3-compatible endpoint (moto's server, a real HTTP listener) with the bucket `unirl-test`."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_ENDPOINT_URL=endpoint)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="unirl-test")
    try:
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def image_server():
    """A loopback HTTP server (127.0.0.1) serving generated images and every bad case; add routes per test."""
    from http_server import ImageServer

    server = ImageServer().start()
    yield server
    server.stop()


SERVICES = {"prefect_harness", "ray_local"}  # session services a test may start through its fixtures


def pytest_collection_modifyitems(items):
    """A test that starts a Prefect harness or a local Ray, directly or through another fixture, is `slow`: the quick
    loop (`pytest -m "not slow"`, `make test-fast`) never waits on a service, whatever marks its file forgot."""
    for item in items:
        if SERVICES & set(getattr(item, "fixturenames", ())) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
