"""The guarded fetcher against a real loopback HTTP server: every network case of RELIABILITY.md's ingest table."""

from __future__ import annotations

import time

import image_cases as cases
import pytest
from http_server import Route

from unirl_core.ingest.fetch import Fetcher, FetchError, FetchPolicy

LOOPBACK_ONLY = ("127.0.0.1/32",)  # the test server; any other private address stays blocked


@pytest.fixture
def fetcher():
    return Fetcher(FetchPolicy(allowed_private_networks=LOOPBACK_ONLY, retry_backoff_s=0.01, read_timeout_s=0.5))


def reason_of(fetcher, url) -> FetchError:
    with pytest.raises(FetchError) as info:
        fetcher.fetch(url)
    return info.value


def test_fetches_bytes_and_follows_redirects(image_server, fetcher):
    data = cases.jpeg(seed=11)
    url = image_server.add("/fetch/a.jpg", data)
    assert fetcher.fetch(url) == data
    image_server.add("/fetch/r1", Route(status=302, location="/fetch/r2"))
    image_server.add("/fetch/r2", Route(status=301, location="{base}/fetch/a.jpg"))
    assert fetcher.fetch(image_server.base + "/fetch/r1") == data


def test_http_errors(image_server, fetcher):
    assert reason_of(fetcher, image_server.base + "/fetch/missing").reason == "failed_to_download"
    image_server.add("/fetch/500", Route(status=500, body=b"boom"))
    error = reason_of(fetcher, image_server.base + "/fetch/500")
    assert error.reason == "failed_to_download" and "HTTP 500" in str(error)
    assert image_server.hits["/fetch/500"] == 3  # 5xx is transient: first try + 2 retries
    assert image_server.hits["/fetch/missing"] == 1  # 404 is permanent: no retry


def test_transient_failures_are_retried_with_backoff(image_server, fetcher):
    data = cases.jpeg(seed=12)
    url = image_server.add("/fetch/flaky.jpg", Route(body=data, fail_first=2))
    assert fetcher.fetch(url) == data
    assert image_server.hits["/fetch/flaky.jpg"] == 3


def test_slow_server_times_out(image_server, fetcher):
    url = image_server.add("/fetch/slow.jpg", Route(body=b"x", delay_s=2.0))
    start = time.monotonic()
    error = reason_of(Fetcher(FetchPolicy(allowed_private_networks=LOOPBACK_ONLY, retries=0, read_timeout_s=0.3)), url)
    assert error.reason == "failed_to_download" and "timed out" in str(error).lower()
    assert time.monotonic() - start < 1.5


def test_dns_failure_and_refused_connection(fetcher):
    assert reason_of(fetcher, "http://no-such-host.invalid/a.jpg").reason == "failed_to_download"
    quick = Fetcher(FetchPolicy(allowed_private_networks=LOOPBACK_ONLY, retries=0))
    assert reason_of(quick, "http://127.0.0.1:9/a.jpg").reason == "failed_to_download"  # nothing listens on 9


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://example.com/a.jpg", "data:image/png;base64,AAAA", "gopher://x/", "/etc/hosts"]
)
def test_disallowed_schemes_are_blocked_without_fetching(fetcher, url):
    assert reason_of(fetcher, url).reason == "blocked_scheme"


def test_local_files_only_with_the_switch(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(b"abc")
    allowed = Fetcher(FetchPolicy(allow_local_files=True))
    assert allowed.fetch(str(path)) == b"abc" and allowed.fetch(f"file://{path}") == b"abc"


@pytest.mark.parametrize(
    "target",
    [
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata (link-local)
        "http://10.0.0.1/a.jpg",
        "http://192.168.1.1/a.jpg",
        "http://[::1]/a.jpg",
        "http://127.0.0.2:{port}/fetch/a.jpg",  # loopback, but outside the allowed 127.0.0.1/32
    ],
)
def test_private_addresses_are_blocked_directly_and_after_redirects(image_server, fetcher, target):
    port = image_server.base.rsplit(":", 1)[1]
    target = target.replace("{port}", port)
    image_server.add("/fetch/a.jpg", cases.jpeg())
    assert reason_of(fetcher, target).reason == "blocked_address"
    image_server.add("/fetch/to-private", Route(status=302, location=target))
    assert reason_of(fetcher, image_server.base + "/fetch/to-private").reason == "blocked_address"


def test_loopback_is_blocked_without_an_allow_list(image_server):
    url = image_server.add("/fetch/b.jpg", cases.jpeg())
    assert reason_of(Fetcher(FetchPolicy()), url).reason == "blocked_address"


def test_redirects_are_capped_and_scheme_checked(image_server, fetcher):
    for i in range(8):
        image_server.add(f"/fetch/loop{i}", Route(status=302, location=f"/fetch/loop{i + 1}"))
    assert "more than 5 redirects" in str(reason_of(fetcher, image_server.base + "/fetch/loop0"))
    image_server.add("/fetch/to-file", Route(status=302, location="file:///etc/passwd"))
    assert reason_of(fetcher, image_server.base + "/fetch/to-file").reason == "blocked_scheme"


def test_byte_cap_by_header_and_by_stream(image_server):
    capped = Fetcher(FetchPolicy(allowed_private_networks=LOOPBACK_ONLY, max_bytes=10_000, retries=0))
    url = image_server.add("/fetch/big.jpg", b"x" * 20_000)
    assert reason_of(capped, url).reason == "too_large"
    endless = image_server.add("/fetch/endless", Route(endless=True))
    start = time.monotonic()
    assert reason_of(capped, endless).reason == "too_large"
    assert time.monotonic() - start < 2
