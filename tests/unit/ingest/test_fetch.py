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


def test_total_timeout_holds_against_trickles_and_endless_redirect_bodies(image_server):
    policy = FetchPolicy(allowed_private_networks=LOOPBACK_ONLY, retries=0, read_timeout_s=1, total_timeout_s=1)
    quick = Fetcher(policy)
    trickle = image_server.add("/fetch/trickle", Route(body=b"x" * 100, trickle_s=0.1))
    start = time.monotonic()
    assert "total timeout" in str(reason_of(quick, trickle))
    assert time.monotonic() - start < 2.5
    image_server.add("/fetch/a.jpg", cases.jpeg())
    endless_redirect = image_server.add("/fetch/endless-302", Route(status=302, location="/fetch/a.jpg", endless=True))
    start = time.monotonic()
    assert quick.fetch(endless_redirect) == cases.jpeg()  # the redirect body is never read
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize(
    "url", ["http://a..b/x.jpg", f"http://{'a' * 64}.com/x.jpg", "http://[::1", "http://[zz]/a", "s3:///key"]
)
def test_malformed_urls_are_row_skips(fetcher, url):
    assert reason_of(fetcher, url).reason == "failed_to_download"


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::",
        "::127.0.0.1",
        "::ffff:10.0.0.1",
        "fec0::1",
        "2001:0:4136:e378::1",
        "fe80::1",
    ],
)
def test_ipv6_forms_of_private_addresses_are_refused(address):
    from unirl_core.ingest.fetch import address_allowed

    assert not address_allowed(address, ())


def test_public_addresses_pass_and_allowed_networks_are_exempt():
    import ipaddress

    from unirl_core.ingest.fetch import address_allowed

    assert address_allowed("93.184.216.34", ()) and address_allowed("2606:4700::1111", ())
    assert address_allowed("64:ff9b::5db8:d822", ())  # NAT64 of a public address
    assert address_allowed("10.1.2.3", (ipaddress.ip_network("10.0.0.0/8"),))


def test_s3_can_be_left_out_of_the_schemes():
    fetcher = Fetcher(FetchPolicy(allowed_schemes=("http", "https")))
    assert reason_of(fetcher, "s3://bucket/key.jpg").reason == "blocked_scheme"


@pytest.fixture
def untrusted_https_server(tmp_path):
    """A loopback HTTPS server with a self-signed certificate (no CA vouches for it); counts TLS connection tries."""
    import datetime
    import ipaddress
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + datetime.timedelta(1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "1")
            self.end_headers()
            self.wfile.write(b"x")

        def log_message(self, *args):
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads, tries = True, 0

        def get_request(self):
            Server.tries += 1
            return super().get_request()  # the TLS handshake, which the client breaks off

        def handle_error(self, request, client_address):
            pass

    server = Server(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, f"https://127.0.0.1:{server.server_address[1]}/a.jpg"
    server.shutdown()


def test_a_tls_error_is_a_skip_with_its_text_and_is_not_retried(untrusted_https_server):
    server, url = untrusted_https_server
    fetcher = Fetcher(FetchPolicy(allowed_private_networks=LOOPBACK_ONLY, retry_backoff_s=0.01))  # retries: 2
    error = reason_of(fetcher, url)
    assert error.reason == "failed_to_download" and "CERTIFICATE_VERIFY_FAILED" in str(error), str(error)
    assert server.tries == 1  # a certificate no CA vouches for stays so: permanent, never retried
