"""A loopback scoring server implementing the remote-scorer JSON contract, with switchable failure modes.

Scores each image by its mean luma in [0, 1] (the `brightness` reward), so a test can compare with a local score;
each video (`videos`: base64 mp4s) by the mean luma of all its frames.
Set attributes between requests: `fail_first` (answer 503 that many times), `delay_s` (before answering),
`status`/`body` (a fixed answer instead of scores), `drop_last` (one score too few).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


class ScoreServer:
    def __init__(self):
        self.requests: list[dict] = []  # {"headers": {...}, "body": {...}} per POST, failures included
        self.reset()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"headers": dict(self.headers), "body": body})
                status, answer = server.answer(body)
                time.sleep(server.delay_s)
                with contextlib.suppress(OSError):  # the client may have given up (read timeout)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def reset(self) -> None:
        self.requests.clear()
        self.fail_first, self.delay_s, self.drop_last = 0, 0.0, False
        self.status: int | None = None
        self.body: bytes = b""

    def answer(self, body: dict) -> tuple[int, bytes]:
        if len(self.requests) <= self.fail_first:
            return 503, b'{"error": "warming up"}'
        if self.status is not None:
            return self.status, self.body
        scores = (
            [_luma(image) for image in body["images"]]
            if "images" in body
            else [_video_luma(video) for video in body["videos"]]
        )
        return 200, json.dumps({"scores": scores[:-1] if self.drop_last else scores}).encode()

    def start(self) -> ScoreServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _luma(png_base64: str) -> float:
    image = Image.open(io.BytesIO(base64.b64decode(png_base64)))
    return float((np.asarray(image.convert("L"), dtype=np.float64) / 255.0).mean())


def _video_luma(mp4_base64: str) -> float:
    from unirl_core.data.video import read_video

    video = read_video(base64.b64decode(mp4_base64))
    return float(np.mean([(np.asarray(f.convert("L"), dtype=np.float64) / 255.0).mean() for f in video.frames]))
