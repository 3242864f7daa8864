"""Remote scorers: a reward computed by a server over HTTP, for scorers whose dependencies cannot share our process.

The JSON contract, one POST per batch of at most `batch_size` samples:

    request   POST <url>   Content-Type: application/json
              {"prompts": ["a cat", ...], "images": ["<base64 PNG>", ...], "sample_ids": ["prompt:0:sample:0", ...],
               "metadata": [{...}, ...]}     each prompt record's `metadata` ({} when none), e.g. GenEval's checks
    response  200          {"scores": [0.73, ...]}     one number per image, in request order

Videos: with `videos: frames` (the default) each scored frame is an image of the request above; with `videos: mp4`
the request carries `"videos": ["<base64 mp4>", ...]` (H.264, yuv420p; `unirl_core.data.video.read_video` reads
one) and `"fps": [16.0, ...]` instead of `images`, and the scores are one number per video.

Any other status is an error. Connection errors and 429/500/502/503/504 are retried `retries` times with
exponential backoff (none before the 1st retry, then `backoff_s` x 2, x 4, ...; a server's Retry-After is
respected); a read timeout is not retried (the server is busy: a retry would queue the same work twice). Out of
retries -> ScorerUnavailableError (transient); a 4xx, a non-JSON body, or scores that are not one number per image
-> RewardError (permanent). Both name the URL. An optional auth header is read from the environment variable named
`auth_header_env`; its value is never logged nor put in an error.
"""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import urllib3
from PIL import Image

from unirl_core.rewards.errors import RewardError, ScorerUnavailableError

if TYPE_CHECKING:
    from unirl_core.config.schema import RemoteScorerConfig

RETRY_STATUSES = (429, 500, 502, 503, 504)


def png_base64(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _media(outputs) -> dict:
    """The request's outputs: `images` (base64 PNGs) or, for whole videos, `videos` (base64 mp4s) and `fps`."""
    from unirl_core.data.video import Video, encode_mp4

    if outputs and all(isinstance(o, Video) for o in outputs):
        return {"videos": [base64.b64encode(encode_mp4(v)).decode("ascii") for v in outputs],
                "fps": [v.fps for v in outputs]}  # fmt: skip
    return {"images": [png_base64(im) for im in outputs]}


class RemoteScorer:
    """A reward served at `url` (contract in the module docstring); called like any reward, with sample ids."""

    wants_metadata = True  # the service passes each sample's prompt metadata

    def __init__(
        self,
        url: str,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 120.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        batch_size: int = 16,
        auth_header: str = "Authorization",
        auth_header_env: str | None = None,
        videos: str = "frames",
    ):
        self.url, self.batch_size, self.read_timeout_s, self.videos = url, batch_size, read_timeout_s, videos
        self._headers = {"Content-Type": "application/json"}
        if auth_header_env is not None:
            secret = os.environ.get(auth_header_env)
            if not secret:
                raise ValueError(
                    f"remote scorer {url}: the environment variable {auth_header_env} (auth_header_env) is unset or "
                    f"empty; export it with the value of the {auth_header} header"
                )
            self._headers[auth_header] = secret
        retry = urllib3.Retry(
            total=retries,
            connect=retries,
            read=0,
            status=retries,
            backoff_factor=backoff_s,
            status_forcelist=RETRY_STATUSES,
            allowed_methods=None,  # POST too: scoring has no side effects
            redirect=False,
            raise_on_status=False,  # the last 5xx comes back and is reported with its status
        )
        timeout = urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s)
        self._http = urllib3.PoolManager(retries=retry, timeout=timeout)

    @classmethod
    def from_config(cls, config: RemoteScorerConfig) -> RemoteScorer:
        return cls(**config.model_dump())

    def __repr__(self) -> str:  # no headers: they may hold a secret
        return f"RemoteScorer({self.url!r}, batch_size={self.batch_size})"

    def __call__(
        self,
        images: Sequence[Image.Image],
        prompts: Sequence[str],
        sample_ids: Sequence[str] = (),
        metadata: Sequence[dict] | None = None,
    ) -> np.ndarray:
        ids = [str(i) for i in sample_ids] if len(sample_ids) else [str(i) for i in range(len(images))]
        metadata = list(metadata) if metadata is not None else [{} for _ in images]
        if not len(prompts) == len(ids) == len(images) == len(metadata):
            raise ValueError(f"remote scorer {self.url}: {len(images)} images, {len(prompts)} prompts, {len(ids)} ids")
        scores = []
        for start in range(0, len(images), self.batch_size):
            batch = slice(start, start + self.batch_size)
            scores.append(self._score_batch(images[batch], prompts[batch], ids[batch], metadata[batch]))
        return np.concatenate(scores) if scores else np.zeros(0)

    def _score_batch(self, images, prompts, sample_ids, metadata) -> np.ndarray:
        body = {"prompts": list(prompts), **_media(images), "sample_ids": list(sample_ids), "metadata": list(metadata)}
        response = self._post(json.dumps(body).encode())
        try:
            payload = json.loads(response.data)
        except ValueError:
            raise RewardError(
                f"remote scorer {self.url} answered 200 with a non-JSON body {_excerpt(response)}"
            ) from None
        scores = payload.get("scores") if isinstance(payload, dict) else None
        if not isinstance(scores, list):
            raise RewardError(f"remote scorer {self.url} answered without a `scores` list: {_excerpt(response)}")
        if len(scores) != len(images):
            raise RewardError(f"remote scorer {self.url} returned {len(scores)} scores for {len(images)} images")
        not_numbers = [i for i, s in zip(sample_ids, scores, strict=True) if type(s) not in (int, float)]
        if not_numbers:
            raise RewardError(f"remote scorer {self.url} returned non-numeric scores for samples {not_numbers}")
        return np.asarray(scores, dtype=np.float64)

    def _post(self, body: bytes) -> urllib3.BaseHTTPResponse:
        try:
            response = self._http.request("POST", self.url, body=body, headers=self._headers)
        except urllib3.exceptions.MaxRetryError as exc:
            raise ScorerUnavailableError(f"remote scorer {self.url} is unreachable: {_reason(exc.reason)}") from None
        except urllib3.exceptions.HTTPError as exc:
            raise ScorerUnavailableError(f"remote scorer {self.url} failed: {_reason(exc)}") from None
        if response.status in RETRY_STATUSES:
            raise ScorerUnavailableError(
                f"remote scorer {self.url} answered HTTP {response.status} after every retry: {_excerpt(response)}"
            )
        if response.status != 200:
            raise RewardError(f"remote scorer {self.url} answered HTTP {response.status}: {_excerpt(response)}")
        return response


def _excerpt(response: urllib3.BaseHTTPResponse) -> str:
    """The body's first 200 characters on one line (an HTML error page's whitespace collapsed)."""
    return repr(" ".join(response.data[:400].decode("utf-8", "replace").split())[:200])


def _reason(error: BaseException | None) -> str:
    if isinstance(error, urllib3.exceptions.ReadTimeoutError):
        return f"no answer within the read timeout ({error})"
    return f"{type(error).__name__}: {error}"
