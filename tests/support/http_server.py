"""A loopback HTTP server for ingest tests: routes to bytes, statuses, redirects, slow and endless bodies."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Route:
    body: bytes = b""
    status: int = 200
    content_type: str = "image/jpeg"
    location: str | None = None  # for redirects
    delay_s: float = 0.0  # before the response
    endless: bool = False  # stream zeros forever, no Content-Length
    fail_first: int = 0  # answer 503 this many times first
    trickle_s: float = 0.0  # send the body one byte at a time, this many seconds apart
    headers: dict = field(default_factory=dict)


class ImageServer:
    def __init__(self):
        self.routes: dict[str, Route] = {}
        self.hits: Counter = Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                server.hits[self.path] += 1
                route = server.routes.get(self.path)
                if route is None:
                    return self._send(404, b"not found", "text/plain")
                if route.delay_s:
                    time.sleep(route.delay_s)
                if server.hits[self.path] <= route.fail_first:
                    return self._send(503, b"slow down", "text/plain")
                if route.location is not None and not route.endless:
                    self.send_response(route.status)
                    self.send_header("Location", route.location.replace("{base}", server.base))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if route.endless:  # an endless body, on a 200 or on a redirect
                    self.send_response(route.status)
                    if route.location is not None:
                        self.send_header("Location", route.location.replace("{base}", server.base))
                    self.send_header("Content-Type", route.content_type)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    try:
                        while True:
                            self.wfile.write(b"\0" * 65536)
                    except OSError:
                        return None
                if route.trickle_s:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(route.body)))
                    self.end_headers()
                    try:
                        for byte in route.body:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(route.trickle_s)
                    except OSError:
                        return None
                    return None
                return self._send(route.status, route.body, route.content_type, route.headers)

            def _send(self, status, body, content_type, headers=None):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)
                return None

        class QuietServer(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # clients hang up on purpose (byte caps, timeouts)

        self.httpd = QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def add(self, path: str, route: Route | bytes) -> str:
        self.routes[path] = route if isinstance(route, Route) else Route(body=route)
        return self.base + path

    def start(self) -> ImageServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
