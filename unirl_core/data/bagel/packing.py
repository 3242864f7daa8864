"""BAGEL's sequence packer (its `PackedDataset`): samples from weighted groups, greedily packed into one long sequence
per step, with BAGEL's layout and key names, and without its silent losses.

Loop (FORMATS.md 5). At an empty pack, one sample of every mandatory group goes in first. Then the next candidate
is, in this order: the carried-over sample (see below), the overflow buffer's oldest sample while the pack is under
`prefer_buffer_before`, else the next sample of a group drawn by weight. A candidate over
`max_num_tokens_per_sample` is skipped and counted ("over_sample_cap"). A candidate that would push the pack over
`max_num_tokens` goes to the buffer if it was freshly drawn and the buffer has room; otherwise the pack is emitted.
A pack is also emitted once it reaches `expected_num_tokens`.

Changes from BAGEL, all deliberate:
- BAGEL drops the candidate on the floor when it emits a pack because of it (it came from the buffer, or the buffer
  was full). Here it becomes the *carried-over* sample: the first candidate of the next pack, right after that pack's
  mandatory samples. At most one sample is carried at a time, so the buffer never exceeds `max_buffer_size`.
  Every drawn sample is packed exactly once or counted as skipped.
- Mandatory draws use the same per-sample cap test as the others (`<= max_num_tokens_per_sample`), and the number
  of mandatory groups times that cap must fit `max_num_tokens` (checked), so no pack ever exceeds the hard cap.
- A pack that reaches the target with its mandatory samples alone is emitted at once.
- The weighted draw falls back to the last group (not the first) if rounding leaves the uniform draw above the last
  cumulative probability.
- One seeded `random.Random` drives the group draws, CFG dropout and timesteps (BAGEL mixes `random` and
  `np.random`); its state is part of `Packer.state()`, so a resumed packer continues with identical packs.

Packed batch contract: a plain dict with the keys below. Under `target: bagel` (the default) a pack leaves out, as
BAGEL's `to_tensor` does, the VAE keys (padded_images, patchified_vae_latent_shapes, packed_latent_position_ids,
packed_vae_token_indexes) and the timestep keys (packed_timesteps, mse_loss_indexes) when it holds no VAE image, the
ViT keys when it holds no ViT image, and the CE keys (packed_label_ids, ce_loss_indexes, ce_loss_weights) when it
holds no text loss: BAGEL's trainer runs a VLM-only pack with `visual_gen: False` only if `padded_images` is absent,
and a t2i-only pack with `visual_und: False` only if the CE keys are (with empty ones its CE is 0 / 0 = NaN). Under
`target: unirl` every key is always present, an absent part as an empty tensor of the right dtype and trailing shape.
L = sequence_length, N_vae / N_vit = number of VAE / ViT images, T_vae / T_vit = their token counts.

    sequence_length              int, L (real tokens, never the flex padding)
    sample_lens                  list[int], tokens per sample; "splits" mode appends the pad (see below)
    packed_text_ids              int64 [n_text]: BOS/EOS and start/end-of-image tokens and text ids
    packed_text_indexes          int64 [n_text]: their positions in the pack
    packed_position_ids          int64 [L]: RoPE position of every token (restarts at 0 per sample)
    nested_attention_masks       ("masks") list of float32 [l, l] per sample: 0 where allowed, -inf elsewhere
    split_lens, attn_modes       ("splits") list[int], list[str] over the pack: flex-attention splits, "causal" |
                                 "full" | "noise"; like BAGEL, a final "causal" split of length
                                 max_num_tokens - L pads the pack to the hard cap, and that pad length is appended
                                 to sample_lens (so both sum to max_num_tokens)
    padded_images                float32 [N_vae, 3, H_max, W_max], zero-padded ([0, 3, 0, 0] when none)
    patchified_vae_latent_shapes list[tuple[int, int]], (h, w) = (H, W) // vae_image_downsample per VAE image
    packed_latent_position_ids   int64 [T_vae]: i * max_latent_size + j per latent (i, j)
    packed_vae_token_indexes     int64 [T_vae]: positions of the latent slots
    packed_timesteps             float32 [T_vae]: -inf on clean VAE slots, N(0, 1) per split on noised ones
    mse_loss_indexes             int64 [n_mse]: positions of the noised latent slots
    packed_vit_tokens            float32 [T_vit, p * p * 3]: patchified ViT images
    packed_vit_position_ids      int64 [T_vit]: i * max_num_patch_per_side + j per patch (i, j)
    packed_vit_token_indexes     int64 [T_vit]: positions of the patches
    vit_token_seqlens            int64 [N_vit]: patches per ViT image
    packed_label_ids             int64 [n_ce]: next-token labels
    ce_loss_indexes              int64 [n_ce]: positions whose output predicts the label
    ce_loss_weights              float32 [n_ce]: 1 / sqrt(len(ids) + 1) per text, 1.0 for special-token loss
    batch_data_indexes           list[dict]: each packed sample's `data_indexes`, in pack order

`batch_check.validate_batch(batch, config)` checks this contract (every position covered exactly once, lengths,
dtypes, timesteps) and raises ValueError naming the broken invariant.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from unirl_core.data.bagel.plans import TEXT, VAE_IMAGE, VIT_IMAGE, Sample
from unirl_core.data.bagel.tokenizer import SpecialTokens
from unirl_core.data.bagel.transforms import TARGETS

ATTENTION_TYPES = ("masks", "splits")
ATTN_MODES = ("causal", "full", "noise")
NEG_INF = float("-inf")
MAX_CONSECUTIVE_SKIPS = 10_000  # a group whose samples are all over the per-sample cap would spin forever


@dataclass(frozen=True)
class PackingConfig:
    """BAGEL's `PackedDataset` and `DataConfig` settings (its defaults). Token counts are per pack, per rank."""

    expected_num_tokens: int = 32768  # target: a pack is emitted once it holds this many tokens
    max_num_tokens: int = 36864  # hard cap: no pack holds more
    max_num_tokens_per_sample: int = 16384  # a sample taking more (with its 2 tokens per plan entry) is skipped
    prefer_buffer_before: int = 16384  # take from the overflow buffer while the pack holds fewer tokens than this
    max_buffer_size: int = 50  # samples held back because they did not fit the pack they were drawn for
    text_cond_dropout_prob: float = 0.1  # CFG dropout of a text element with enable_cfg
    vit_cond_dropout_prob: float = 0.3  # CFG dropout of a ViT image with enable_cfg
    vae_cond_dropout_prob: float = 0.3  # CFG dropout of a clean VAE image with enable_cfg (noised targets: never)
    vae_image_downsample: int = 16  # pixels per latent side (VAE downsample 8 x latent patch 2)
    # latent grid side the position ids are laid out on: the model's own (BAGEL's training default 32, the released
    # BAGEL-7B-MoT 64); None: 32 under target bagel, 64 under target unirl
    max_latent_size: int | None = None
    vit_patch_size: int = 14  # pixels per ViT patch side
    max_num_patch_per_side: int = 70  # ViT patch grid side the position ids are laid out on
    attention: str = "masks"  # "masks": a dense [l, l] mask per sample; "splits": flex split_lens + attn_modes
    seed: int = 0  # seeds the packer's generator (group draws, CFG dropout, timesteps)
    target: str = "bagel"  # "bagel": BAGEL's key set per pack (module docstring); "unirl": every key, always

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"packing target must be one of {TARGETS}, got {self.target!r}")
        if self.max_latent_size is None:
            object.__setattr__(self, "max_latent_size", 32 if self.target == "bagel" else 64)
        positive = ("expected_num_tokens", "max_num_tokens", "max_num_tokens_per_sample", "vae_image_downsample",
                    "max_latent_size", "vit_patch_size", "max_num_patch_per_side")  # fmt: skip
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"packing.{name} must be at least 1, got {getattr(self, name)}")
        for name in ("prefer_buffer_before", "max_buffer_size"):
            if getattr(self, name) < 0:
                raise ValueError(f"packing.{name} must be at least 0, got {getattr(self, name)}")
        for name in ("expected_num_tokens", "max_num_tokens_per_sample"):
            if getattr(self, name) > self.max_num_tokens:
                raise ValueError(
                    f"packing.{name}={getattr(self, name)} exceeds packing.max_num_tokens={self.max_num_tokens}"
                )
        for name in ("text_cond_dropout_prob", "vit_cond_dropout_prob", "vae_cond_dropout_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"packing.{name} must be a probability in [0, 1], got {getattr(self, name)}")
        if self.attention not in ATTENTION_TYPES:
            raise ValueError(f"packing.attention must be one of {ATTENTION_TYPES}, got {self.attention!r}")

    @classmethod
    def from_dict(cls, settings: dict[str, Any]) -> PackingConfig:
        """From a mixture's `packing:` mapping; an unknown key is an error naming the known ones."""
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f"unknown packing keys {unknown}: the known keys are {', '.join(known)}")
        return cls(**settings)


class GroupReader(Protocol):
    """One group's endless sample source (a dataset reader of one worker)."""

    dataset_name: str
    skipped: collections.Counter  # reason -> count, for rows the dataset itself could not use

    def __next__(self) -> Sample: ...

    def state(self) -> dict:  # JSON-able position after the last sample returned
        ...

    def sample_at(self, data_indexes: dict) -> Sample:  # rebuild a previously returned sample exactly
        ...


@dataclass
class PackGroup:
    name: str
    weight: float  # relative draw weight; 0: drawn only as a mandatory sample
    is_mandatory: bool  # one sample of this group starts every pack
    reader: GroupReader


# ---- layout helpers -------------------------------------------------------------------------------------------------


def patchify(image_3HW: torch.Tensor, patch: int) -> torch.Tensor:
    """[3, H, W] -> [(H/p) * (W/p), p * p * 3]: patches row-major, each flattened as (p, p, channel)."""
    channels, height, width = image_3HW.shape
    assert height % patch == 0 and width % patch == 0, f"image {height}x{width} is not a multiple of patch {patch}"
    grid = image_3HW.reshape(channels, height // patch, patch, width // patch, patch)
    return grid.permute(1, 3, 2, 4, 0).reshape(-1, patch * patch * channels)


def grid_position_ids(height: int, width: int, grid_side: int) -> torch.Tensor:
    """int64 [height * width]: i * grid_side + j for cell (i, j), row-major (BAGEL's extrapolating layout)."""
    return (torch.arange(height)[:, None] * grid_side + torch.arange(width)).flatten()


def attention_mask(split_lens: list[int], attn_modes: list[str]) -> torch.Tensor:
    """float32 [l, l] for one sample: causal overall, full inside "full"/"noise" splits, and the tokens of a "noise"
    split hidden from every token outside it. 0 where a query (row) may attend to a key (column), -inf elsewhere."""
    length = sum(split_lens)
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    start = 0
    for split_len, mode in zip(split_lens, attn_modes, strict=True):
        end = start + split_len
        if mode != "causal":
            allowed[start:end, start:end] = True
        if mode == "noise":
            allowed[end:, start:end] = False
        start = end
    return torch.zeros(length, length).masked_fill_(~allowed, NEG_INF)


# ---- one pack in progress -------------------------------------------------------------------------------------------


@dataclass
class _Cursor:
    """One sample's counters while its elements are packed."""

    rope: int = 0  # next position id
    split_len: int = 0  # tokens of the current split so far
    split_lens: list[int] = field(default_factory=list)
    attn_modes: list[str] = field(default_factory=list)
    timestep: float | None = None  # the current split's noise timestep


class _Pack:
    """BAGEL's `sequence_status`: the lists a pack accumulates, turned into tensors by `to_batch`."""

    def __init__(self, special: SpecialTokens, config: PackingConfig):
        self.special, self.config = special, config
        self.curr = 0
        self.sample_lens: list[int] = []
        self.data_indexes: list[dict] = []
        self.datasets: list[str] = []
        self.position_ids: list[int] = []
        self.masks: list[torch.Tensor] = []
        self.split_lens: list[int] = []
        self.attn_modes: list[str] = []
        self.text_ids: list[int] = []
        self.text_indexes: list[int] = []
        self.label_ids: list[int] = []
        self.ce_indexes: list[int] = []
        self.ce_weights: list[float] = []
        self.vae_images: list[torch.Tensor] = []
        self.latent_shapes: list[tuple[int, int]] = []
        self.latent_position_ids: list[torch.Tensor] = []
        self.vae_indexes: list[int] = []
        self.timesteps: list[float] = []
        self.mse_indexes: list[int] = []
        self.vit_tokens: list[torch.Tensor] = []
        self.vit_seqlens: list[int] = []
        self.vit_position_ids: list[torch.Tensor] = []
        self.vit_indexes: list[int] = []

    # -- a sample --

    def add(self, sample: Sample, dataset: str, rng: random.Random) -> None:
        start, cursor = self.curr, _Cursor()
        texts, images = iter(sample.text_ids_list), iter(sample.image_tensor_list)
        for entry in sample.sequence_plan:
            if entry.get("split_start", True):
                cursor.split_len = 0
            if entry["type"] == TEXT:
                packed = self._add_text(next(texts), entry, cursor, rng)
            elif entry["type"] == VIT_IMAGE:
                packed = self._add_vit(next(images), entry, cursor, rng)
            elif entry["type"] == VAE_IMAGE:
                packed = self._add_vae(next(images), entry, cursor, rng)
            else:
                raise ValueError(f"sequence plan entry of unknown type {entry['type']!r} in {sample.data_indexes}")
            if packed and entry.get("split_end", True):
                cursor.split_lens.append(cursor.split_len)
        assert sum(cursor.split_lens) == self.curr - start and len(cursor.split_lens) == len(cursor.attn_modes)
        self._close_sample(sample, dataset, cursor)

    def _close_sample(self, sample: Sample, dataset: str, cursor: _Cursor) -> None:
        self.sample_lens.append(sum(cursor.split_lens))
        self.data_indexes.append(sample.data_indexes)
        self.datasets.append(dataset)
        if self.config.attention == "masks":
            self.masks.append(attention_mask(cursor.split_lens, cursor.attn_modes))
        else:
            self.split_lens.extend(cursor.split_lens)
            self.attn_modes.extend(cursor.attn_modes)

    # -- tokens --

    def _put_text(self, ids: list[int], cursor: _Cursor) -> None:
        self.text_ids.extend(ids)
        self.text_indexes.extend(range(self.curr, self.curr + len(ids)))
        self._advance(len(ids), cursor)

    def _advance(self, num_tokens: int, cursor: _Cursor) -> None:
        self.curr += num_tokens
        cursor.split_len += num_tokens

    def _put_closing(self, token: int, entry: dict, cursor: _Cursor) -> None:
        """EOS / end-of-image, with a CE label when the entry asks for special-token loss."""
        if entry["special_token_loss"] == 1:
            assert entry["special_token_label"] is not None, "special_token_loss needs a special_token_label"
            self.ce_indexes.append(self.curr)
            self.ce_weights.append(1.0)
            self.label_ids.append(int(entry["special_token_label"]))
        self._put_text([token], cursor)

    def _dropped(self, entry: dict, probability: float, rng: random.Random) -> bool:
        return entry["enable_cfg"] == 1 and rng.random() < probability

    # -- elements --

    def _add_text(self, ids: list[int], entry: dict, cursor: _Cursor, rng: random.Random) -> bool:
        """BOS + ids (+ CE on ids + EOS when loss), EOS; causal; one position id per token."""
        if self._dropped(entry, self.config.text_cond_dropout_prob, rng):
            return False
        shifted = [self.special.bos_token_id, *ids]
        if entry["loss"] == 1:
            self.ce_indexes.extend(range(self.curr, self.curr + len(shifted)))
            self.ce_weights.extend([1.0 / math.sqrt(len(shifted))] * len(shifted))
            self.label_ids.extend([*ids, self.special.eos_token_id])
        self._put_text(shifted, cursor)
        self._put_closing(self.special.eos_token_id, entry, cursor)
        length = len(shifted) + 1
        self.position_ids.extend(range(cursor.rope, cursor.rope + length))
        cursor.rope += length
        cursor.attn_modes.append("causal")
        return True

    def _add_vit(self, image_3HW: torch.Tensor, entry: dict, cursor: _Cursor, rng: random.Random) -> bool:
        """Start-of-image, patches, end-of-image; full attention; one position id for the whole image."""
        if self._dropped(entry, self.config.vit_cond_dropout_prob, rng):
            cursor.rope += 1
            return False
        patch, side = self.config.vit_patch_size, self.config.max_num_patch_per_side
        height, width = image_3HW.shape[1] // patch, image_3HW.shape[2] // patch
        _check_grid("ViT patch", height, width, side, "max_num_patch_per_side")
        tokens = patchify(image_3HW, patch)
        self._put_text([self.special.start_of_image], cursor)
        self.vit_indexes.extend(range(self.curr, self.curr + len(tokens)))
        self.vit_tokens.append(tokens)
        self.vit_seqlens.append(len(tokens))
        self.vit_position_ids.append(grid_position_ids(height, width, side))
        self._advance(len(tokens), cursor)
        self._put_closing(self.special.end_of_image, entry, cursor)
        self.position_ids.extend([cursor.rope] * (len(tokens) + 2))
        cursor.rope += 1
        cursor.attn_modes.append("full")
        return True

    def _add_vae(self, image_3HW: torch.Tensor, entry: dict, cursor: _Cursor, rng: random.Random) -> bool:
        """Start-of-image, h * w latent slots, end-of-image. Noised target (loss 1): MSE, a N(0, 1) timestep per split,
        "noise" attention, position not advanced. Clean condition: timestep -inf, "full", position advanced."""
        split_start, split_end = entry.get("split_start", True), entry.get("split_end", True)
        # BAGEL draws for every enable_cfg VAE image but drops only one that is its own split
        if self._dropped(entry, self.config.vae_cond_dropout_prob, rng) and split_start and split_end:
            cursor.rope += 1
            return False
        height, width = (side // self.config.vae_image_downsample for side in image_3HW.shape[1:])
        _check_grid("VAE latent", height, width, self.config.max_latent_size, "max_latent_size")
        num_slots, noised = height * width, entry["loss"] == 1
        self._put_text([self.special.start_of_image], cursor)
        self.vae_indexes.extend(range(self.curr, self.curr + num_slots))
        self.vae_images.append(image_3HW)
        self.latent_shapes.append((height, width))
        self.latent_position_ids.append(grid_position_ids(height, width, self.config.max_latent_size))
        if noised:
            self.mse_indexes.extend(range(self.curr, self.curr + num_slots))
            if split_start:
                cursor.timestep = rng.gauss(0.0, 1.0)
            assert cursor.timestep is not None, "a noised VAE image continues a split that never started"
        self.timesteps.extend([cursor.timestep if noised else NEG_INF] * num_slots)
        self._advance(num_slots, cursor)
        self._put_closing(self.special.end_of_image, entry, cursor)
        if split_start:
            cursor.attn_modes.append("noise" if noised and "frame_delta" not in entry else "full")
        self.position_ids.extend([cursor.rope] * (num_slots + 2))
        cursor.rope += entry["frame_delta"] if "frame_delta" in entry else int(not noised)
        return True

    # -- the batch --

    def to_batch(self) -> dict[str, Any]:
        batch = {
            "sequence_length": self.curr,
            "sample_lens": list(self.sample_lens),
            "packed_text_ids": _int64(self.text_ids),
            "packed_text_indexes": _int64(self.text_indexes),
            "packed_position_ids": _int64(self.position_ids),
        }
        every = self.config.target == "unirl"
        batch |= self._attention()
        if every or self.vae_images:
            batch |= self._vae_keys()
        if every or self.timesteps:
            batch |= self._timestep_keys()
        if every or self.vit_tokens:
            batch |= self._vit_keys()
        if every or self.label_ids:
            batch |= {
                "packed_label_ids": _int64(self.label_ids),
                "ce_loss_indexes": _int64(self.ce_indexes),
                "ce_loss_weights": torch.tensor(self.ce_weights, dtype=torch.float32),
            }
        batch["batch_data_indexes"] = list(self.data_indexes)
        return batch

    def _attention(self) -> dict[str, Any]:
        if self.config.attention == "masks":
            return {"nested_attention_masks": list(self.masks)}
        pad = self.config.max_num_tokens - self.curr
        return {
            "sample_lens": [*self.sample_lens, pad],
            "split_lens": [*self.split_lens, pad],
            "attn_modes": [*self.attn_modes, "causal"],
        }

    def _vae_keys(self) -> dict[str, Any]:
        return {
            "padded_images": _pad_images(self.vae_images),
            "patchified_vae_latent_shapes": list(self.latent_shapes),
            "packed_latent_position_ids": _cat_int64(self.latent_position_ids),
            "packed_vae_token_indexes": _int64(self.vae_indexes),
        }

    def _timestep_keys(self) -> dict[str, Any]:
        return {
            "packed_timesteps": torch.tensor(self.timesteps, dtype=torch.float32),
            "mse_loss_indexes": _int64(self.mse_indexes),
        }

    def _vit_keys(self) -> dict[str, Any]:
        width = self.config.vit_patch_size**2 * 3
        tokens = torch.cat(self.vit_tokens).float() if self.vit_tokens else torch.zeros(0, width)
        return {
            "packed_vit_tokens": tokens,
            "packed_vit_position_ids": _cat_int64(self.vit_position_ids),
            "packed_vit_token_indexes": _int64(self.vit_indexes),
            "vit_token_seqlens": _int64(self.vit_seqlens),
        }


def _check_grid(what: str, height: int, width: int, side: int, key: str) -> None:
    if max(height, width) > side:
        raise ValueError(
            f"a {what} grid of {height}x{width} does not fit packing.{key}={side}: raise {key} or lower the image "
            "transform's max_image_size"
        )


def _int64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _cat_int64(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts).to(torch.int64) if parts else torch.zeros(0, dtype=torch.int64)


def _pad_images(images: list[torch.Tensor]) -> torch.Tensor:
    """float32 [N, 3, H_max, W_max], each image in the top-left corner, zeros elsewhere."""
    if not images:
        return torch.zeros(0, 3, 0, 0)
    height, width = max(image.shape[1] for image in images), max(image.shape[2] for image in images)
    padded = torch.zeros(len(images), 3, height, width)
    for index, image in enumerate(images):
        padded[index, :, : image.shape[1], : image.shape[2]] = image
    return padded


# ---- the packer -----------------------------------------------------------------------------------------------------


@dataclass
class PackStats:
    """Running pack counters since the start of the run (restored on resume)."""

    target: int  # expected_num_tokens, for the fill ratio
    num_packs: int = 0
    num_tokens: int = 0  # summed over packs
    num_samples: collections.Counter = field(default_factory=collections.Counter)  # dataset -> samples packed
    skipped: dict[str, collections.Counter] = field(default_factory=dict)  # dataset -> reason -> samples (packer's)
    reader_skipped: dict[str, dict[str, int]] = field(default_factory=dict)  # the readers' own, as of the last pack

    def skip(self, dataset: str, reason: str) -> None:
        self.skipped.setdefault(dataset, collections.Counter())[reason] += 1

    def record(self, pack: _Pack, groups: list[PackGroup]) -> None:
        self.num_packs += 1
        self.num_tokens += pack.curr
        self.num_samples.update(pack.datasets)
        self.reader_skipped = {group.reader.dataset_name: dict(group.reader.skipped) for group in groups}

    def summary(self) -> dict[str, Any]:
        """tokens_per_pack, fill_ratio (mean tokens / target), samples_per_pack by dataset, skipped by dataset and
        reason (the packer's skips and the readers' own)."""
        packs = max(self.num_packs, 1)
        skipped: dict[str, dict[str, int]] = {name: dict(counts) for name, counts in self.reader_skipped.items()}
        for name, counts in self.skipped.items():
            skipped[name] = dict(collections.Counter(skipped.get(name, {})) + counts)
        skipped = {name: counts for name, counts in skipped.items() if counts}
        return {
            "packs": self.num_packs,
            "tokens_per_pack": self.num_tokens / packs,
            "fill_ratio": self.num_tokens / (packs * self.target),
            "samples_per_pack": {name: count / packs for name, count in sorted(self.num_samples.items())},
            "skipped": skipped,
        }


class Packer:
    """Packed batches (module docstring) from weighted groups; iterate it. `state()` after a pack, passed to a new
    Packer whose readers were built from `state["groups"][name]`, continues with identical packs."""

    def __init__(
        self, groups: list[PackGroup], special: SpecialTokens, config: PackingConfig, state: dict | None = None
    ):
        _check_groups(groups, config)
        self.groups, self.special, self.config = groups, special, config
        total = sum(group.weight for group in groups)
        self._cumprobs = [sum(group.weight for group in groups[: i + 1]) / total for i in range(len(groups))]
        self.rng = random.Random(config.seed)
        self.buffer: collections.deque[tuple[int, Sample]] = collections.deque()  # (group index, sample), oldest first
        self.carry: tuple[int, Sample] | None = None  # the sample that made the last pack emit: next pack's first
        self.stats = PackStats(target=config.expected_num_tokens)
        self._skips_in_a_row = 0
        if state is not None:
            self._load(state)

    def __iter__(self) -> Packer:
        return self

    def __next__(self) -> dict[str, Any]:
        pack = _Pack(self.special, self.config)
        self._add_mandatory(pack)
        while pack.curr < self.config.expected_num_tokens:
            source, group, sample = self._candidate(pack.curr)
            if self._over_sample_cap(group, sample):
                continue
            if pack.curr + sample.packed_tokens() <= self.config.max_num_tokens:
                self._add(pack, group, sample)
            elif source == "draw" and len(self.buffer) < self.config.max_buffer_size:
                self.buffer.append((group, sample))
            else:
                self.carry = (group, sample)  # BAGEL drops it here
                break
        return self._emit(pack)

    def _add_mandatory(self, pack: _Pack) -> None:
        for index, group in enumerate(self.groups):
            if group.is_mandatory:
                sample = next(group.reader)
                while self._over_sample_cap(index, sample):
                    sample = next(group.reader)
                self._add(pack, index, sample)

    def _candidate(self, curr: int) -> tuple[str, int, Sample]:
        """("carry" | "buffer" | "draw", group index, sample)."""
        if self.carry is not None:
            (group, sample), self.carry = self.carry, None
            return "carry", group, sample
        if curr < self.config.prefer_buffer_before and self.buffer:
            group, sample = self.buffer.popleft()
            return "buffer", group, sample
        uniform = self.rng.random()
        group = next((i for i, cumprob in enumerate(self._cumprobs) if uniform < cumprob), len(self.groups) - 1)
        return "draw", group, next(self.groups[group].reader)

    def _over_sample_cap(self, group: int, sample: Sample) -> bool:
        if sample.packed_tokens() <= self.config.max_num_tokens_per_sample:
            return False
        self.stats.skip(self.groups[group].reader.dataset_name, "over_sample_cap")
        self._skips_in_a_row += 1
        if self._skips_in_a_row > MAX_CONSECUTIVE_SKIPS:
            raise RuntimeError(
                f"{self._skips_in_a_row} samples in a row over packing.max_num_tokens_per_sample="
                f"{self.config.max_num_tokens_per_sample} (last from group {self.groups[group].name!r}): raise the cap "
                "or lower the image sizes"
            )
        return True

    def _add(self, pack: _Pack, group: int, sample: Sample) -> None:
        pack.add(sample, self.groups[group].reader.dataset_name, self.rng)
        self._skips_in_a_row = 0

    def _emit(self, pack: _Pack) -> dict[str, Any]:
        assert pack.sample_lens and pack.curr <= self.config.max_num_tokens
        self.stats.record(pack, self.groups)
        return pack.to_batch()

    # -- resume --

    def state(self) -> dict[str, Any]:
        """JSON-able snapshot after the last yielded pack."""
        version, internal, gauss_next = self.rng.getstate()
        return {
            "groups": {group.name: group.reader.state() for group in self.groups},
            "buffer": [self._entry(group, sample) for group, sample in self.buffer],
            "carry": self._entry(*self.carry) if self.carry is not None else None,
            "rng": [version, list(internal), gauss_next],
            "skipped": {name: dict(counts) for name, counts in self.stats.skipped.items()},
            "packs": self.stats.num_packs,
            "tokens": self.stats.num_tokens,
            "samples": dict(self.stats.num_samples),
        }

    def _entry(self, group: int, sample: Sample) -> dict[str, Any]:
        return {"group": self.groups[group].name, "data_indexes": sample.data_indexes}

    def _load(self, state: dict[str, Any]) -> None:
        names = [group.name for group in self.groups]
        if sorted(state["groups"]) != sorted(names):
            raise ValueError(f"the packer state was saved for groups {sorted(state['groups'])}, not {sorted(names)}")
        self.buffer = collections.deque(self._rebuild(entry) for entry in state["buffer"])
        self.carry = self._rebuild(state["carry"]) if state.get("carry") else None
        version, internal, gauss_next = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss_next))
        self.stats.skipped = {name: collections.Counter(counts) for name, counts in state["skipped"].items()}
        self.stats.num_packs, self.stats.num_tokens = state["packs"], state.get("tokens", 0)
        self.stats.num_samples = collections.Counter(state.get("samples", {}))

    def _rebuild(self, entry: dict[str, Any]) -> tuple[int, Sample]:
        group = [g.name for g in self.groups].index(entry["group"])
        return group, self.groups[group].reader.sample_at(entry["data_indexes"])


def _check_groups(groups: list[PackGroup], config: PackingConfig) -> None:
    names = [group.name for group in groups]
    if not groups or len(set(names)) != len(names):
        raise ValueError(f"the packer needs at least one group and unique group names, got {names}")
    if any(group.weight < 0 for group in groups) or sum(group.weight for group in groups) <= 0:
        raise ValueError(f"group weights must be >= 0 with a positive sum, got {[g.weight for g in groups]}")
    num_mandatory = sum(group.is_mandatory for group in groups)
    if num_mandatory * config.max_num_tokens_per_sample > config.max_num_tokens:
        raise ValueError(
            f"{num_mandatory} mandatory groups x packing.max_num_tokens_per_sample="
            f"{config.max_num_tokens_per_sample} exceed packing.max_num_tokens={config.max_num_tokens}: the mandatory "
            "samples alone could overflow a pack; lower the per-sample cap or mark fewer groups mandatory"
        )
