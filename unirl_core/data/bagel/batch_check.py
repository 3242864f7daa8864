"""The packed batch contract (packing.py's docstring), checked: the key set of the target (every key under `unirl`;
under `bagel` each optional group present exactly when the pack has that part, as BAGEL's `to_tensor` writes it),
dtypes, every position covered exactly once, lengths, masks or splits, VAE timesteps, CE indexes. ValueError names
the first broken invariant."""

from __future__ import annotations

from typing import Any

import torch

from unirl_core.data.bagel.packing import ATTN_MODES, NEG_INF, PackingConfig

_INT64_KEYS = ("packed_text_ids", "packed_text_indexes", "packed_position_ids", "packed_latent_position_ids",
               "packed_vae_token_indexes", "mse_loss_indexes", "packed_vit_position_ids", "packed_vit_token_indexes",
               "vit_token_seqlens", "packed_label_ids", "ce_loss_indexes")  # fmt: skip
_FLOAT32_KEYS = ("padded_images", "packed_timesteps", "packed_vit_tokens", "ce_loss_weights")
_LIST_KEYS = ("sample_lens", "patchified_vae_latent_shapes", "batch_data_indexes")
_ATTENTION_KEYS = {"masks": ("nested_attention_masks",), "splits": ("split_lens", "attn_modes")}
# BAGEL's optional key groups (its to_tensor): each written only when the pack has that part
OPTIONAL_GROUPS = {
    "vae": ("padded_images", "patchified_vae_latent_shapes", "packed_latent_position_ids", "packed_vae_token_indexes"),
    "timesteps": ("packed_timesteps", "mse_loss_indexes"),
    "vit": ("packed_vit_tokens", "packed_vit_position_ids", "packed_vit_token_indexes", "vit_token_seqlens"),
    "ce": ("packed_label_ids", "ce_loss_indexes", "ce_loss_weights"),
}


def batch_keys(config: PackingConfig) -> tuple[str, ...]:
    """Every key a packed batch can have in this attention mode (all of them, always, under target unirl)."""
    return ("sequence_length", *_LIST_KEYS, *_INT64_KEYS, *_FLOAT32_KEYS, *_ATTENTION_KEYS[config.attention])


def _empty(key: str, config: PackingConfig) -> Any:
    if key == "patchified_vae_latent_shapes":
        return []
    if key == "padded_images":
        return torch.zeros(0, 3, 0, 0)
    if key == "packed_vit_tokens":
        return torch.zeros(0, config.vit_patch_size**2 * 3)
    return torch.zeros(0, dtype=torch.float32 if key in _FLOAT32_KEYS else torch.int64)


def _with_empty_groups(batch: dict[str, Any], config: PackingConfig) -> dict[str, Any]:
    """Under target bagel: check each optional group is all there or all absent, absent exactly when the pack has no
    such part, and fill the absent ones with empties for the checks below."""
    filled = dict(batch)
    for name, keys in OPTIONAL_GROUPS.items():
        present = [key in batch for key in keys]
        _require(all(present) or not any(present), f"the {name} keys {list(keys)} must be all present or all absent")
        if all(present):
            _require(len(batch[keys[0]]) > 0, f"an empty {name} part must be left out under target bagel ({keys[0]})")
        else:
            filled |= {key: _empty(key, config) for key in keys}
    return filled


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"packed batch: {message}")


def validate_batch(batch: dict[str, Any], config: PackingConfig) -> None:
    """Check a packed batch against packing.py's contract; ValueError names the first broken invariant."""
    if config.target == "bagel":
        batch = _with_empty_groups(batch, config)
    missing = sorted(set(batch_keys(config)) - set(batch))
    foreign = sorted(set(batch) - set(batch_keys(config)))
    _require(not missing and not foreign, f"missing keys {missing}, unexpected keys {foreign}")
    _check_dtypes(batch, config)
    length = batch["sequence_length"]
    _require(0 < length <= config.max_num_tokens, f"sequence_length {length} outside 1..{config.max_num_tokens}")
    _check_coverage(batch, length)
    if config.attention == "masks":
        _check_masks(batch, length)
    else:
        _check_splits(batch, config, length)
    _check_vae(batch, config)
    _check_vit(batch)
    _check_ce(batch)


def _check_dtypes(batch: dict[str, Any], config: PackingConfig) -> None:
    for key, dtype in [*((k, torch.int64) for k in _INT64_KEYS), *((k, torch.float32) for k in _FLOAT32_KEYS)]:
        value = batch[key]
        _require(isinstance(value, torch.Tensor) and value.dtype == dtype, f"{key} must be a {dtype} tensor")
        _require(key in ("padded_images", "packed_vit_tokens") or value.dim() == 1, f"{key} must be 1-D")
    images, tokens = batch["padded_images"], batch["packed_vit_tokens"]
    _require(images.dim() == 4 and images.shape[1] == 3, f"padded_images must be [N, 3, H, W], got {images.shape}")
    width = config.vit_patch_size**2 * 3
    _require(tokens.dim() == 2 and tokens.shape[1] == width, f"packed_vit_tokens must be [T, {width}]")


def _check_coverage(batch: dict[str, Any], length: int) -> None:
    """Every position 0..L-1 is a text, VAE or ViT token, exactly once."""
    indexes = torch.cat(
        [batch[k] for k in ("packed_text_indexes", "packed_vae_token_indexes", "packed_vit_token_indexes")]
    )
    _require(len(indexes) == length and bool((indexes >= 0).all() and (indexes < length).all()),
             f"{len(indexes)} text/VAE/ViT indexes for sequence_length {length}")  # fmt: skip
    _require(bool((torch.bincount(indexes, minlength=length) == 1).all()), "a position is covered twice or never")
    _require(
        len(batch["packed_text_ids"]) == len(batch["packed_text_indexes"]), "text ids and indexes differ in length"
    )
    _require(len(batch["packed_position_ids"]) == length, "packed_position_ids must have one id per token")


def _check_masks(batch: dict[str, Any], length: int) -> None:
    sample_lens, masks = batch["sample_lens"], batch["nested_attention_masks"]
    _require(sum(sample_lens) == length, f"sample_lens sum to {sum(sample_lens)}, not {length}")
    _require(len(masks) == len(sample_lens) == len(batch["batch_data_indexes"]), "one mask and index dict per sample")
    for mask, sample_len in zip(masks, sample_lens, strict=True):
        _require(mask.dtype == torch.float32 and mask.shape == (sample_len, sample_len), "mask shape is [l, l] float32")
        _require(bool(((mask == 0) | (mask == NEG_INF)).all()), "mask values must be 0 or -inf")
        _require(bool((mask.diagonal() == 0).all()), "every token must attend to itself")


def _check_splits(batch: dict[str, Any], config: PackingConfig, length: int) -> None:
    sample_lens, split_lens, modes = batch["sample_lens"], batch["split_lens"], batch["attn_modes"]
    pad = config.max_num_tokens - length
    _require(sample_lens[-1] == pad == split_lens[-1] and modes[-1] == "causal", "the last split must be the pad")
    _require(sum(sample_lens) == sum(split_lens) == config.max_num_tokens, "lengths must sum to max_num_tokens")
    _require(len(sample_lens) - 1 == len(batch["batch_data_indexes"]), "one sample_lens entry per sample plus the pad")
    _require(len(modes) == len(split_lens) and set(modes) <= set(ATTN_MODES), "one known attn_mode per split")
    split_ends = set(torch.tensor(split_lens).cumsum(0).tolist())
    _require(set(torch.tensor(sample_lens).cumsum(0).tolist()) <= split_ends, "a split straddles two samples")


def _check_vae(batch: dict[str, Any], config: PackingConfig) -> None:
    shapes, images = batch["patchified_vae_latent_shapes"], batch["padded_images"]
    _require(len(shapes) == images.shape[0], "one latent shape per padded image")
    down = config.vae_image_downsample
    _require(all(h * down <= images.shape[2] and w * down <= images.shape[3] for h, w in shapes), "latent > image")
    indexes, timesteps, mse = batch["packed_vae_token_indexes"], batch["packed_timesteps"], batch["mse_loss_indexes"]
    num_slots = sum(h * w for h, w in shapes)
    _require(len(indexes) == len(timesteps) == len(batch["packed_latent_position_ids"]) == num_slots,
             f"VAE indexes, timesteps and latent position ids must all have {num_slots} entries")  # fmt: skip
    noised = torch.isin(indexes, mse)
    _require(int(noised.sum()) == len(mse) == len(set(mse.tolist())), "mse_loss_indexes must be distinct VAE slots")
    _require(bool(torch.isfinite(timesteps[noised]).all()), "noised VAE slots need finite timesteps")
    _require(bool((timesteps[~noised] == NEG_INF).all()), "clean VAE slots need timestep -inf")


def _check_vit(batch: dict[str, Any]) -> None:
    num_tokens = int(batch["vit_token_seqlens"].sum())
    lengths = [len(batch[k]) for k in ("packed_vit_tokens", "packed_vit_position_ids", "packed_vit_token_indexes")]
    _require(lengths == [num_tokens] * 3, f"ViT tokens, position ids and indexes must all have {num_tokens} entries")


def _check_ce(batch: dict[str, Any]) -> None:
    indexes, weights = batch["ce_loss_indexes"], batch["ce_loss_weights"]
    _require(len(batch["packed_label_ids"]) == len(indexes) == len(weights), "one label and weight per CE index")
    _require(bool(torch.isin(indexes, batch["packed_text_indexes"]).all()), "CE indexes must be text positions")
    _require(bool((torch.isfinite(weights) & (weights > 0)).all()), "CE weights must be positive and finite")
