"""The data of supervised warm-up rounds: (scaled VAE latent, prompt conditioning) pairs from a finished precache.

    data = WarmupData(precache_config, batch_size=32, latent_key="sd3_latent", text_key="sd3_prompt", seed=0)
    batch = data.next_batch()             # {"keys": [B], "latents": [B,C,h,w] float32, "cond": {name: [B,...]}}
                                          #   (a video cache: latents [B,C,F,h,w], the same code path)
    share = split_batch(batch, world)[r]  # rank r's contiguous B / world samples
    loss = family.denoising_loss(share["latents"], share["cond"], generator)

The cache is read through `read_encodings` (identity-checked, no pickle) once, to check every sample and index
where its encodings lie (shard, member offsets); a batch then reads its samples by offset (`read_sample`: a seek
locally, a range request on S3). Memory stays at the index (a few hundred bytes a sample) whatever the cache size;
holding SD3 at 512 px in memory would take ~3 MB a sample (fp16 conditioning 334 x 4096 x 2 B, latents
16 x 64 x 64 x 4 B). Samples are ordered by key, so the order does not depend on how many precache tasks wrote the
cache; epoch e visits them in the permutation drawn from (seed, e), batches never cross an epoch, and the last
partial batch is dropped (as `unirl_core.data.sources.PromptListSource`).

Latents are the posterior mean (deterministic: the same sample gives the same x0 every epoch; a cache built with
`latent: sample` gives its one stored draw instead, with a warning), shifted and scaled like
`family.encode_images`; conditioning is a `PipelinePromptEncoder` encoding, unpacked into the family's
`encode_texts` dict (float32 here; the family casts to its dtype).

Videos (`modality: video` encodings, e.g. recipe `pipeline_video`): a `PipelineImageEncoder` of a video family
stores the family's normalized latents [C, F, h, w] (Wan: [16, (frames - 1) / 4 + 1, H / 8, W / 8]); they batch,
split over ranks (`split_batch` slices the sample axis only) and reach `family.denoising_loss` unchanged.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np
import torch

from unirl_core.config.precache import PrecacheConfig
from unirl_core.data.resume import EpochCursor
from unirl_core.models.registry import family_class, resolve_model_path
from unirl_core.precache.read import encoding_spans, read_encodings, read_sample

PROMPT_ENCODER = "unirl_core.precache.encoders.PipelinePromptEncoder"
LATENT_ENCODER = "unirl_core.precache.encoders.AutoencoderKLEncoder"
IMAGE_ENCODER = "unirl_core.precache.encoders.PipelineImageEncoder"  # already the family's scaled latents
logger = logging.getLogger(__name__)


def latents_from_encoding(encoding: torch.Tensor, vae_config: Mapping, stored: str = "parameters") -> torch.Tensor:
    """An `AutoencoderKLEncoder` encoding ([2C,h,w] or [B,2C,h,w] for `stored="parameters"`: mean, then
    log-variance on the channel axis; [C,h,w] for `mean`/`sample`) -> scaled float32 latents [..., C, h, w]:
    (mean - shift_factor) * scaling_factor, exactly `Family.encode_pixels`. `vae_config`: the VAE's config.
    `stored="scaled"`: a `PipelineImageEncoder` encoding, already the family's scaled latents."""
    latents = encoding.float()
    if stored == "scaled":
        return latents
    if stored == "parameters":
        latents = latents.chunk(2, dim=-3)[0]  # DiagonalGaussianDistribution's split: mean, logvar
    if vae_config.get("shift_factor") is not None:
        latents = latents - vae_config["shift_factor"]
    return latents * vae_config["scaling_factor"]


def split_batch(batch: dict, world_size: int) -> list[dict]:
    """Rank r's share of a global batch: samples [r B/W, (r+1) B/W) of every entry (keys, tensors, nested dicts)."""
    size = len(batch["keys"])
    if size % world_size:
        raise ValueError(
            f"a batch of {size} samples does not split evenly over {world_size} ranks ({size} % {world_size} = "
            f"{size % world_size}); use a batch size that is a multiple of the world size"
        )
    share = size // world_size
    return [_take(batch, r * share, (r + 1) * share) for r in range(world_size)]


def _take(value: Any, start: int, stop: int) -> Any:
    if isinstance(value, dict):
        return {k: _take(v, start, stop) for k, v in value.items()}
    return value[start:stop]


class WarmupData(EpochCursor):
    """Global batches of `batch_size` (latents, conditioning) pairs from a finished precache, epoch after epoch,
    resumable exactly through `state_dict()`. Reading happens on first use."""

    def __init__(
        self,
        precache: PrecacheConfig,
        batch_size: int,
        *,
        latent_key: str,
        text_key: str,
        seed: int = 0,
        shuffle: bool = True,
        trusted: bool = False,
    ):
        if not precache.output_dir:
            raise ValueError("warm-up data needs precache.output_dir (the finished cache to read)")
        self.precache, self.folder = precache, precache.output_dir
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.trusted = trusted or precache.trusted  # a nemo_pickle cache the recipe marks trusted
        self.latent_key, self.text_key = latent_key, text_key
        self.latent_config = self._encoder_config(latent_key, LATENT_ENCODER, IMAGE_ENCODER)
        if self._modality(latent_key) == "video" and self.latent_config["cls"] != IMAGE_ENCODER:
            raise ValueError(
                f"{self.folder}: encodings[{latent_key}] holds video latents from {self.latent_config['cls']}; "
                f"warm-up on videos needs {IMAGE_ENCODER} with the video family (family: wan)"
            )
        self.text_config = self._encoder_config(text_key, PROMPT_ENCODER)
        self.family: str = self.text_config["family"]  # the family the conditioning is for
        self.epoch, self.batch_in_epoch = 0, 0
        self._keys: list[str] | None = None

    def _modality(self, key: str) -> str:
        return next(spec.modality for spec in self.precache.encodings if spec.key == key)

    def _encoder_config(self, key: str, *classes: str) -> dict[str, Any]:
        specs = {spec.key: spec.encoder_config.model_dump() for spec in self.precache.encodings}
        if key not in specs:
            raise ValueError(f"{self.folder}: the precache has no encoding {key!r}; it has {sorted(specs)}")
        if specs[key]["cls"] not in classes:
            raise ValueError(
                f"{self.folder}: encodings[{key}] is built by {specs[key]['cls']}; warm-up needs {' or '.join(classes)}"
            )
        return specs[key]

    def _load(self) -> None:
        """Index every sample once, sorted by key: where its encodings lie (shard, member offsets), not the tensors.
        The pass decodes each sample once to check it (both encodings present, one shape across the cache)."""
        if self._keys is not None:
            return
        if self.latent_config["cls"] == IMAGE_ENCODER:
            self._vae, self._stored = {}, "scaled"
        else:
            self._vae = _vae_config(self.latent_config)
            self._stored = self.latent_config.get("latent", "parameters")
        if self._stored == "sample":
            logger.warning("%s: latents were stored as one VAE sample each; warm-up uses it, not the mean", self.folder)
        rows, shapes = [], {"latents": {}, "conditioning": {}}
        wanted = [self.latent_key, self.text_key]
        for sample in read_encodings(self.folder, self.precache, trusted=self.trusted):
            found = sample["encodings"]
            missing = [k for k in wanted if k not in found]
            if missing:
                raise ValueError(f"{self.folder}: sample {sample['key']} lacks {missing}; it has {sorted(found)}")
            latents = latents_from_encoding(found[self.latent_key], self._vae, self._stored)
            shapes["latents"].setdefault(tuple(latents.shape), sample["key"])
            shapes["conditioning"].setdefault(tuple(found[self.text_key].shape), sample["key"])
            rows.append((sample["key"], sample["shard"], encoding_spans(sample["spans"], wanted)))
        if len(rows) < self.batch_size:
            raise ValueError(
                f"{self.folder} holds {len(rows)} samples, fewer than the warm-up batch size {self.batch_size}: "
                "precache more samples or lower the batch size"
            )
        for what, example in shapes.items():  # one key per shape
            if len(example) > 1:
                raise ValueError(
                    f"{self.folder}: {what} of different shapes cannot form a batch ({example}); precache with "
                    "image_transform mode center_crop or resize (one size) and, for text, store_pad_tokens: true"
                )
        rows.sort(key=lambda row: row[0])
        self._keys = [r[0] for r in rows]
        self._where = [(r[1], r[2]) for r in rows]
        self._unpack = partial(family_class(self.family).unpack_conditioning,
                               path=resolve_model_path(self.text_config["pretrained"]))  # fmt: skip
        self._order = self._epoch_order(self.epoch)

    def _read(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        shard, spans = self._where[index]
        found = read_sample(shard, spans, [self.latent_key, self.text_key], self.trusted)
        return latents_from_encoding(found[self.latent_key], self._vae, self._stored), found[self.text_key]

    def __len__(self) -> int:
        self._load()
        return len(self._keys)

    @property
    def batches_per_epoch(self) -> int:
        return len(self) // self.batch_size  # the last partial batch is dropped

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self._keys))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self._keys))

    def next_batch(self) -> dict:
        """{"keys": [B], "latents": float32 [B,C,h,w] or [B,C,F,h,w], "cond": {"embeds": float32 [B,T,D][,
        "pooled": [B,P]]}}."""
        self._load()
        if self.batch_in_epoch == self.batches_per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        start = self.batch_in_epoch * self.batch_size
        self.batch_in_epoch += 1
        index = self._order[start : start + self.batch_size].tolist()
        latents, packed = zip(*(self._read(i) for i in index), strict=True)
        cond = self._unpack(torch.stack(packed).float())
        return {"keys": [self._keys[i] for i in index], "latents": torch.stack(latents), "cond": cond}

    def _settings(self) -> dict[str, Any]:
        self._load()
        return {
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_samples": len(self._keys),
            "keys_sha256": hashlib.sha256("\n".join(self._keys).encode()).hexdigest()[:16],
        }

    def _resume_error(self, details: str) -> str:
        return (
            f"{self.folder}: the warm-up data changed since this state was saved ({details}); resume with the "
            "original cache and settings, or start a new run"
        )


def _vae_config(encoder_config: dict[str, Any]) -> Mapping:
    """The config (scaling_factor, shift_factor) of the VAE an `AutoencoderKLEncoder` encoding was made with."""
    from diffusers import AutoencoderKL

    subfolder = encoder_config.get("subfolder", "vae")  # AutoencoderKLEncoder's default
    return AutoencoderKL.load_config(resolve_model_path(encoder_config["pretrained"]), subfolder=subfolder)


def open_warmup_data(train_config, precache: PrecacheConfig) -> WarmupData:
    """The warm-up batches a recipe's `train.warmup` asks for, from its `precache` section's finished cache."""
    warmup = train_config.warmup
    data = WarmupData(
        precache, warmup.batch_size, latent_key=warmup.latent_key, text_key=warmup.text_key, seed=warmup.seed
    )
    if data.family != train_config.model.family:
        raise ValueError(
            f"{precache.output_dir}: the prompt conditioning was precached for family {data.family!r}, but "
            f"train.model.family is {train_config.model.family!r}"
        )
    return data
