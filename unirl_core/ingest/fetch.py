"""Guarded image fetching: user-supplied URLs are an SSRF risk (RELIABILITY.md, security defaults).

- Scheme allow-list: http, https, s3; `file://` and plain paths only with `allow_local_files`.
- Address check on the connected socket, at every redirect hop: loopback, private, link-local (169.254.169.254),
  multicast and reserved addresses are refused unless `allow_private_addresses`. Checking the peer of the socket
  we actually opened, before any byte is sent, leaves no DNS-rebinding gap between a check and a connect.
- Redirects followed by hand, capped; connect/read timeouts and a total deadline per attempt; a byte cap that
  stops reading at the cap (an endless body costs at most `max_bytes` of memory).
- Transient failures (connection errors, timeouts, 5xx, 429) are retried with exponential backoff and jitter;
  permanent ones (4xx, blocked, too large) are not.

Every failure is a `FetchError` carrying the skip reason recorded for the row.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

REDIRECT_STATUSES = {301, 302, 303, 307, 308}
CHUNK = 64 * 1024


class FetchError(Exception):
    """A URL that yields no image bytes. `reason` is the row's skip reason; `transient` says a retry may help."""

    def __init__(self, reason: str, message: str, transient: bool = False):
        super().__init__(message)
        self.reason = reason
        self.transient = transient


class BlockedAddressError(Exception):
    """Raised from inside the connection: deliberately not an OSError, so urllib3 neither wraps nor retries it."""


@dataclass(frozen=True)
class FetchPolicy:
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    total_timeout_s: float = 30.0
    retries: int = 2
    retry_backoff_s: float = 0.5
    max_redirects: int = 5
    max_bytes: int = 32 * 1024 * 1024
    allow_local_files: bool = False
    allowed_private_networks: tuple[str, ...] = ()  # CIDRs exempt from the address check, e.g. ("127.0.0.0/8",)
    allowed_schemes: tuple[str, ...] = ("http", "https", "s3")
    user_agent: str = "unirl-ingest/0.1 (+https://github.com/unirl)"


NAT64 = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated ::a.b.c.d
# site-local, Teredo, discard-only, local-use NAT64: never a public image host
NOT_ROUTED_IPV6 = [ipaddress.ip_network(n) for n in ("fec0::/10", "2001::/32", "100::/64", "64:ff9b:1::/48")]


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries: mapped, NAT64, 6to4, or IPv4-compatible (::a.b.c.d)."""
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address in NAT64 or (address in IPV4_COMPATIBLE and int(address) > 1):  # not :: or ::1
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_allowed(host: str, allowed_networks: tuple) -> bool:
    """True for public unicast addresses and for addresses inside an explicitly allowed network. IPv6 forms that
    embed an IPv4 address are judged by that address; Teredo, site-local and other unrouted IPv6 are refused."""
    address = ipaddress.ip_address(host.split("%")[0])
    if any(address in network for network in allowed_networks if network.version == address.version):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            return address_allowed(str(embedded), allowed_networks)
        if any(address in network for network in NOT_ROUTED_IPV6):
            return False
    return address.is_global and not address.is_multicast


class _GuardedConnectionMixin:
    allowed_networks: tuple = ()

    def _new_conn(self):
        # Before connecting: every address the name resolves to must be allowed (no connect to 169.254.169.254).
        try:
            resolved = {info[4][0] for info in socket.getaddrinfo(self._dns_host, self.port, type=socket.SOCK_STREAM)}
        except OSError:
            resolved = set()  # let the real connect report the resolution failure
        blocked = sorted(a for a in resolved if not address_allowed(a, self.allowed_networks))
        if blocked:
            raise BlockedAddressError(f"{self.host} resolves to non-public address {blocked[0]}")
        sock = super()._new_conn()
        # After connecting: the peer we really reached (a second DNS answer may differ from the first).
        peer = sock.getpeername()[0]
        if not address_allowed(peer, self.allowed_networks):
            sock.close()
            raise BlockedAddressError(f"{self.host} connected to non-public address {peer}")
        return sock


def _guarded_pool_manager(policy: FetchPolicy, num_pools: int, pool_size: int) -> urllib3.PoolManager:
    def connection_class(base):
        return type(f"Guarded{base.__name__}", (_GuardedConnectionMixin, base), {"allowed_networks": networks})

    networks = tuple(ipaddress.ip_network(n, strict=False) for n in policy.allowed_private_networks)
    http_pool = type("GuardedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": connection_class(HTTPConnection)})
    https_pool = type("GuardedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": connection_class(HTTPSConnection)})
    manager = urllib3.PoolManager(num_pools=num_pools, maxsize=pool_size, headers={"User-Agent": policy.user_agent})
    manager.pool_classes_by_scheme = {"http": http_pool, "https": https_pool}
    return manager


class Fetcher:
    """Thread-safe: one per work unit (or process), shared by its fetch threads."""

    def __init__(self, policy: FetchPolicy, num_pools: int = 64, pool_size: int = 16):
        self.policy = policy
        self._http = _guarded_pool_manager(policy, num_pools, pool_size)
        self._timeout = urllib3.Timeout(connect=policy.connect_timeout_s, read=policy.read_timeout_s)

    def fetch(self, url: str) -> bytes:
        """The body at `url`, retrying transient failures. Raises FetchError with the skip reason."""
        for attempt in range(self.policy.retries + 1):
            try:
                return self._fetch_once(url)
            except FetchError as exc:
                if not exc.transient or attempt == self.policy.retries:
                    raise
                time.sleep(self.policy.retry_backoff_s * 2**attempt * (1 + random.random()))
        raise AssertionError("unreachable")

    def _fetch_once(self, url: str) -> bytes:
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError as exc:
            raise FetchError("failed_to_download", f"bad URL {url[:200]!r}: {exc}") from None
        if scheme not in self.policy.allowed_schemes and scheme in ("http", "https", "s3"):
            raise FetchError("blocked_scheme", f"scheme {scheme!r} is not in allowed_url_schemes: {url[:200]}")
        if scheme in ("http", "https"):
            return self._fetch_http(url)
        if scheme == "s3":
            return self._fetch_fsspec(url)
        if self.policy.allow_local_files and (scheme == "file" or (not scheme and url.startswith("/"))):
            return self._fetch_local(url[len("file://") :] if scheme == "file" else url)
        raise FetchError("blocked_scheme", f"scheme {scheme or '(none)'!r} is not allowed: {url[:200]}")

    def _fetch_http(self, url: str) -> bytes:
        deadline = time.monotonic() + self.policy.total_timeout_s
        for _hop in range(self.policy.max_redirects + 1):
            response = self._request(url)
            if response.status not in REDIRECT_STATUSES:
                return self._read_body(url, response, deadline)
            location = response.headers.get("Location")
            response.close()  # never read a redirect body (it may be endless); the connection is not reused
            if not location:
                raise FetchError("failed_to_download", f"redirect {response.status} without Location: {url}")
            url = urljoin(url, location)
            if urlsplit(url).scheme.lower() not in ("http", "https"):
                raise FetchError("blocked_scheme", f"redirect to a disallowed scheme: {url[:200]}")
        raise FetchError("failed_to_download", f"more than {self.policy.max_redirects} redirects")

    def _request(self, url: str) -> urllib3.BaseHTTPResponse:
        try:
            return self._http.request(
                "GET", url, preload_content=False, redirect=False, retries=False, timeout=self._timeout
            )
        except BlockedAddressError as exc:
            raise FetchError("blocked_address", str(exc)) from None
        except (urllib3.exceptions.LocationParseError, ValueError) as exc:  # UnicodeError (IDNA) is a ValueError
            raise FetchError("failed_to_download", f"bad URL: {exc}") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            permanent = isinstance(exc, urllib3.exceptions.NameResolutionError | urllib3.exceptions.SSLError)
            raise FetchError("failed_to_download", f"{type(exc).__name__}: {exc}", transient=not permanent) from None

    def _read_body(self, url: str, response: urllib3.BaseHTTPResponse, deadline: float) -> bytes:
        try:
            if response.status != 200:
                transient = response.status >= 500 or response.status == 429
                raise FetchError("failed_to_download", f"HTTP {response.status}: {url[:200]}", transient=transient)
            declared = response.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) > self.policy.max_bytes:
                raise FetchError("too_large", f"Content-Length {declared} > max_bytes {self.policy.max_bytes}")
            body = bytearray()
            while chunk := response.read1(CHUNK):  # what has arrived, not a full CHUNK: trickles meet the deadline
                body += chunk
                if len(body) > self.policy.max_bytes:
                    raise FetchError("too_large", f"body exceeds max_bytes {self.policy.max_bytes}")
                if time.monotonic() > deadline:
                    raise FetchError("failed_to_download", f"total timeout {self.policy.total_timeout_s}s", True)
            response.release_conn()  # fully read: the connection can serve the next URL
            return bytes(body)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise FetchError("failed_to_download", f"{type(exc).__name__}: {exc}", transient=True) from None
        finally:
            if not response.isclosed() and response.connection is not None:
                response.close()  # not fully read (error, cap, timeout): never reuse this connection

    def _fetch_fsspec(self, url: str) -> bytes:
        import fsspec

        try:
            with fsspec.open(url, "rb") as f:
                body = f.read(self.policy.max_bytes + 1)
        except FileNotFoundError:
            raise FetchError("failed_to_download", f"no such object: {url}") from None
        except ValueError as exc:  # a malformed URL such as s3:///key
            raise FetchError("failed_to_download", f"bad URL {url[:200]!r}: {exc}") from None
        except OSError as exc:
            raise FetchError("failed_to_download", f"{type(exc).__name__}: {exc}", transient=True) from None
        if len(body) > self.policy.max_bytes:
            raise FetchError("too_large", f"object exceeds max_bytes {self.policy.max_bytes}")
        return body

    def _fetch_local(self, path: str) -> bytes:
        try:
            with Path(path).open("rb") as f:
                body = f.read(self.policy.max_bytes + 1)
        except OSError as exc:
            raise FetchError("failed_to_download", f"{type(exc).__name__}: {exc}") from None
        if len(body) > self.policy.max_bytes:
            raise FetchError("too_large", f"file exceeds max_bytes {self.policy.max_bytes}")
        return body
