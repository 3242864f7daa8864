"""BAGEL's training step in miniature: what its trainer (train/pretrain_unified_navit.py) and `Bagel.forward`
(modeling/bagel/bagel.py) do with a packed batch, on tiny modules, so the tests can show that our packs are
trainable as they are, and fail where BAGEL's trainer would fail on them.

The trainer, as facts: it pops `batch_data_indexes` and `ce_loss_weights`; with `visual_gen` it replaces
`padded_images` by `padded_latent` (the frozen VAE's encoding); then calls `model(**data)`, so every other key must
be a parameter of `Bagel.forward` (`FORWARD_ARGS`: a VLM-only pack that still holds `padded_images` fails there with
visual_gen off). A returned `ce` of None needs `visual_und` off; otherwise CE = sum / len(ce_loss_indexes) (empty
indexes: 0 / 0 = NaN). With `visual_gen`, MSE = sum over noised slots of the channel mean / len(mse_loss_indexes).

`Bagel.forward`, as here: text ids -> embeddings at `packed_text_indexes`; with `visual_und`, ViT patches -> a
projection plus the patch position embedding at `packed_vit_token_indexes`; with `visual_gen`, each image's latent
cropped to its `patchified_vae_latent_shapes` and patchified (2 x 2) -> noised with sigmoid(timestep) where
`packed_timesteps` is finite (clean conditions at t = 0) -> projection + timestep and latent position embeddings at
`packed_vae_token_indexes`; one attention layer over the pack with the per-sample `nested_attention_masks` and
`packed_position_ids` as a position embedding; CE per token at `ce_loss_indexes` when given; MSE (velocity:
noise - clean) of the noised slots, selected as `packed_timesteps > 0` in VAE-slot order and read at
`mse_loss_indexes` in sequence order (the two orders must agree).
"""

from __future__ import annotations

import inspect

import torch
from diffusers import AutoencoderKL
from torch import nn

LATENT_PATCH = 2
# Bagel.forward's parameters (ByteDance-Seed/Bagel modeling/bagel/bagel.py), in its order
FORWARD_ARGS = (
    "sequence_length", "packed_text_ids", "packed_text_indexes", "sample_lens", "packed_position_ids",
    "nested_attention_masks", "split_lens", "attn_modes", "ce_loss_indexes", "packed_label_ids", "packed_vit_tokens",
    "packed_vit_token_indexes", "packed_vit_position_ids", "vit_token_seqlens", "padded_latent",
    "patchified_vae_latent_shapes", "packed_latent_position_ids", "packed_vae_token_indexes", "packed_timesteps",
    "mse_loss_indexes",
)  # fmt: skip


class MiniBagel(nn.Module):
    def __init__(self, vocab_size: int, vit_patch_size: int = 14, max_latent_size: int = 32,
                 max_num_patch_per_side: int = 70, max_positions: int = 8192, dim: int = 32,
                 visual_gen: bool = True, visual_und: bool = True):  # fmt: skip
        super().__init__()
        self.visual_gen, self.visual_und = visual_gen, visual_und
        self.vae = AutoencoderKL(
            in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
            down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        ).requires_grad_(False)  # fmt: skip  # frozen, downsample 8, as BAGEL's
        latent_width = 4 * LATENT_PATCH * LATENT_PATCH
        self.embed = nn.Embedding(vocab_size, dim)
        self.position = nn.Embedding(max_positions, dim)
        self.vit = nn.Linear(vit_patch_size * vit_patch_size * 3, dim)
        self.vit_position = nn.Embedding(max_num_patch_per_side**2, dim)
        self.vae2llm = nn.Linear(latent_width, dim)
        self.time = nn.Linear(1, dim)
        self.latent_position = nn.Embedding(max_latent_size**2, dim)
        self.attention = nn.MultiheadAttention(dim, num_heads=4, batch_first=True)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.lm_head = nn.Linear(dim, vocab_size)
        self.llm2vae = nn.Linear(dim, latent_width)
        self.noise = torch.Generator().manual_seed(0)  # BAGEL draws with randn_like; a generator keeps tests fixed
        assert tuple(inspect.signature(self.forward).parameters) == FORWARD_ARGS

    def encode(self, padded_images: torch.Tensor) -> torch.Tensor:
        """The trainer's `vae_model.encode(padded_images)`."""
        with torch.no_grad():
            return self.vae.encode(padded_images).latent_dist.mean

    def forward(
        self, sequence_length, packed_text_ids, packed_text_indexes, sample_lens, packed_position_ids,
        nested_attention_masks=None, split_lens=None, attn_modes=None, ce_loss_indexes=None, packed_label_ids=None,
        packed_vit_tokens=None, packed_vit_token_indexes=None, packed_vit_position_ids=None, vit_token_seqlens=None,
        padded_latent=None, patchified_vae_latent_shapes=None, packed_latent_position_ids=None,
        packed_vae_token_indexes=None, packed_timesteps=None, mse_loss_indexes=None,
    ) -> dict[str, torch.Tensor | None]:  # fmt: skip
        """{"ce": per-token CE or None, "mse": per-slot, per-channel squared error or None}."""
        sequence = torch.zeros(sequence_length, self.embed.embedding_dim)
        sequence = sequence.index_put((packed_text_indexes,), self.embed(packed_text_ids))
        if self.visual_und:
            vit = self.vit(packed_vit_tokens) + self.vit_position(packed_vit_position_ids)
            sequence = sequence.index_put((packed_vit_token_indexes,), vit)
        if self.visual_gen:
            clean = self._patchified(padded_latent, patchified_vae_latent_shapes)
            timesteps = torch.sigmoid(packed_timesteps)  # -inf (clean conditions) -> 0
            noise = torch.randn(clean.shape, generator=self.noise)
            noised = (1 - timesteps[:, None]) * clean + timesteps[:, None] * noise
            vae = (
                self.vae2llm(noised) + self.time(timesteps[:, None]) + self.latent_position(packed_latent_position_ids)
            )
            sequence = sequence.index_put((packed_vae_token_indexes,), vae)
        sequence = sequence + self.position(packed_position_ids)
        mask = torch.full((sequence_length, sequence_length), float("-inf"))
        start = 0
        for sample_mask, sample_len in zip(nested_attention_masks, sample_lens, strict=True):
            mask[start : start + sample_len, start : start + sample_len] = sample_mask
            start += sample_len
        attended, _ = self.attention(sequence[None], sequence[None], sequence[None], attn_mask=mask)
        hidden = sequence + attended[0]
        hidden = hidden + self.mlp(hidden)
        ce = None
        if ce_loss_indexes is not None:
            ce = nn.functional.cross_entropy(self.lm_head(hidden[ce_loss_indexes]), packed_label_ids, reduction="none")
        mse = None
        if self.visual_gen:
            has_mse = timesteps > 0  # BAGEL's selection, in VAE-slot order
            mse = (self.llm2vae(hidden[mse_loss_indexes]) - (noise - clean)[has_mse]) ** 2
        return {"ce": ce, "mse": mse}

    @staticmethod
    def _patchified(padded_latent: torch.Tensor, shapes: list[tuple[int, int]]) -> torch.Tensor:
        out = []
        for one, (h, w) in zip(padded_latent, shapes, strict=True):
            one = one[:, : h * LATENT_PATCH, : w * LATENT_PATCH].reshape(4, h, LATENT_PATCH, w, LATENT_PATCH)
            out.append(torch.einsum("chpwq->hwpqc", one).reshape(h * w, -1))
        return torch.cat(out) if out else torch.zeros(0, 4 * LATENT_PATCH * LATENT_PATCH)


def train_step(model: MiniBagel, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """BAGEL's trainer on one pack (module docstring): (loss, {"ce", "mse"}); raises where BAGEL's raises."""
    data = {k: v for k, v in batch.items() if k not in ("data_status", "worker_id")}  # our loader's resume keys
    data.pop("batch_data_indexes", None)
    data.pop("ce_loss_weights", None)
    if model.visual_gen:
        data["padded_latent"] = model.encode(data.pop("padded_images"))
    loss_dict = model(**data)
    loss, losses = torch.zeros(()), {}
    if loss_dict["ce"] is not None:
        losses["ce"] = loss_dict["ce"].sum() / torch.tensor(len(data["ce_loss_indexes"]))
        loss = loss + losses["ce"]
    else:
        assert not model.visual_und, "no CE in the pack but visual_und is on"
        losses["ce"] = torch.zeros(())
    if model.visual_gen:
        losses["mse"] = loss_dict["mse"].mean(dim=-1).sum() / torch.tensor(len(data["mse_loss_indexes"]))
        loss = loss + losses["mse"]
    else:
        losses["mse"] = torch.zeros(())
    return loss, losses
