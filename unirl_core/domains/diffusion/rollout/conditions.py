"""Condition images for image-to-image rollouts (prompts with an (image, condition) `media_refs` entry).

The image is loaded like an ingest download (scheme allow-list, private addresses refused before connecting and on
the socket, byte cap, pixel cap before decoding, known formats only), transposed by EXIF, flattened to RGB, then
center-cropped and resized to the rollout's size. Its VAE latent is encoded once per process and (uri, size).
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image, ImageOps

from unirl_core.data.grpo_groups import RolloutSample
from unirl_core.errors import UserError


class ConditionImageError(UserError, ValueError):
    """A condition image that cannot be used (blocked, missing, too large, not an image), naming its uri."""


@dataclass(frozen=True)
class ConditionPolicy:
    max_bytes: int = 32 * 1024 * 1024
    max_pixels: int = 64 * 1024 * 1024
    allowed_schemes: tuple[str, ...] = ("http", "https", "s3")
    allowed_private_networks: tuple[str, ...] = ()


def condition_uri(sample: RolloutSample) -> str | None:
    refs = [r for r in sample.example.media_refs if (r.modality, r.role) == ("image", "condition")]
    return refs[0].uri if refs else None


def load_condition_image(uri: str, width: int, height: int, policy: ConditionPolicy = ConditionPolicy()):
    """The condition image at `uri` as RGB `width` x `height` (center crop), or ConditionImageError."""
    from unirl_core.ingest.fetch import Fetcher, FetchError, FetchPolicy
    from unirl_core.ingest.images import SkipSample, open_image, to_rgb

    fetcher = Fetcher(
        FetchPolicy(
            max_bytes=policy.max_bytes,
            allow_local_files=True,
            allowed_schemes=policy.allowed_schemes,
            allowed_private_networks=policy.allowed_private_networks,
            user_agent="unirl-rollout/0.1",
        ),
        num_pools=4,
        pool_size=1,
    )
    try:
        image = open_image(fetcher.fetch(uri), policy.max_pixels)
        image = to_rgb(ImageOps.exif_transpose(image))
    except (FetchError, SkipSample) as exc:
        reason = getattr(exc, "reason", "")
        raise ConditionImageError(f"condition image {uri}: {reason}: {exc}") from None
    return ImageOps.fit(image, (width, height), method=Image.Resampling.LANCZOS)


class ConditionLatents:
    """Condition images -> VAE latents for one family, each (uri, size) loaded and encoded once per process."""

    def __init__(self, family, policy: ConditionPolicy = ConditionPolicy()):
        self.family, self.policy, self.latents, self.images = family, policy, {}, {}

    def load(self, uris: list[str], width: int, height: int) -> list:
        """The condition images (RGB, `width` x `height`) of `uris`, in order."""
        for uri in dict.fromkeys(uris):
            if (uri, width, height) not in self.images:
                self.images[(uri, width, height)] = load_condition_image(uri, width, height, self.policy)
        return [self.images[(uri, width, height)] for uri in uris]

    def __call__(self, uris: list[str], width: int, height: int):
        import torch

        for uri, image in zip(uris, self.load(uris, width, height), strict=True):
            if (uri, width, height) not in self.latents:
                self.latents[(uri, width, height)] = self.family.encode_images([image])[0].cpu()
        return torch.stack([self.latents[(uri, width, height)] for uri in uris]).to(self.family.device)
