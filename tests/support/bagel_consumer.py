"""BAGEL's training forward in miniature: what its `Bagel.forward` does with a packed batch, on tiny modules, so the
tests can show that our packs are trainable as they are (with or without VAE, ViT or text loss).

Mirrors BAGEL's steps: text ids -> embeddings at `packed_text_indexes`; ViT patches -> a projection plus the patch
position embedding at `packed_vit_token_indexes`; `padded_images` -> a real (tiny) diffusers VAE -> each image's
latent cropped to its `patchified_vae_latent_shapes` and patchified (2 x 2) -> noised with sigmoid(timestep) where
`packed_timesteps` is finite (clean conditions at t = 0) -> projection + timestep and latent position embeddings at
`packed_vae_token_indexes`; one attention layer over the whole pack with the per-sample `nested_attention_masks`
(block-diagonal, -inf between samples) and `packed_position_ids` as a position embedding; CE at `ce_loss_indexes`
against `packed_label_ids` weighted by `ce_loss_weights`; MSE (velocity: noise - clean) of the noised slots, which
BAGEL selects as `packed_timesteps > 0` in VAE-slot order and reads at `mse_loss_indexes` in sequence order (the two
orders must agree).
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderKL
from torch import nn

LATENT_PATCH = 2


class MiniBagel(nn.Module):
    def __init__(self, vocab_size: int, vit_patch_size: int = 14, max_latent_size: int = 64,
                 max_num_patch_per_side: int = 70, max_positions: int = 8192, dim: int = 32):  # fmt: skip
        super().__init__()
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

    def latents(self, batch: dict) -> torch.Tensor:
        """[T_vae, 4 * 2 * 2]: every VAE image's latent, cropped and patchified in slot order."""
        images = batch["padded_images"]
        if images.shape[0] == 0:
            return torch.zeros(0, self.vae2llm.in_features)
        with torch.no_grad():
            latent = self.vae.encode(images).latent_dist.mean
        out = []
        for one, (h, w) in zip(latent, batch["patchified_vae_latent_shapes"], strict=True):
            one = one[:, : h * LATENT_PATCH, : w * LATENT_PATCH].reshape(4, h, LATENT_PATCH, w, LATENT_PATCH)
            out.append(torch.einsum("chpwq->hwpqc", one).reshape(h * w, -1))
        return torch.cat(out)

    def forward(self, batch: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
        length = batch["sequence_length"]
        sequence = torch.zeros(length, self.embed.embedding_dim)
        sequence = sequence.index_put((batch["packed_text_indexes"],), self.embed(batch["packed_text_ids"]))
        vit = self.vit(batch["packed_vit_tokens"]) + self.vit_position(batch["packed_vit_position_ids"])
        sequence = sequence.index_put((batch["packed_vit_token_indexes"],), vit)
        clean = self.latents(batch)
        timesteps = torch.sigmoid(batch["packed_timesteps"])  # -inf (clean conditions) -> 0
        noise = torch.randn(clean.shape, generator=generator)
        noised = (1 - timesteps[:, None]) * clean + timesteps[:, None] * noise
        vae = (
            self.vae2llm(noised)
            + self.time(timesteps[:, None])
            + self.latent_position(batch["packed_latent_position_ids"])
        )
        sequence = sequence.index_put((batch["packed_vae_token_indexes"],), vae)
        sequence = sequence + self.position(batch["packed_position_ids"])
        mask = torch.full((length, length), float("-inf"))
        start = 0
        for sample_mask, sample_len in zip(batch["nested_attention_masks"], batch["sample_lens"], strict=True):
            mask[start : start + sample_len, start : start + sample_len] = sample_mask
            start += sample_len
        attended, _ = self.attention(sequence[None], sequence[None], sequence[None], attn_mask=mask)
        hidden = sequence + attended[0]
        hidden = hidden + self.mlp(hidden)
        losses = {}
        ce = nn.functional.cross_entropy(
            self.lm_head(hidden[batch["ce_loss_indexes"]]), batch["packed_label_ids"], reduction="none"
        )
        losses["ce"] = (ce * batch["ce_loss_weights"]).sum() / max(len(ce), 1)
        has_mse = timesteps > 0  # BAGEL's selection, in VAE-slot order
        target = (noise - clean)[has_mse]
        prediction = self.llm2vae(hidden[batch["mse_loss_indexes"]])
        losses["mse"] = ((prediction - target) ** 2).mean() if len(target) else hidden.sum() * 0.0
        return losses
