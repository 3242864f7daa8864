"""The VAE-codec part of a family: scaled latents <-> images (PIL) and pixels, in chunks of `vae_decode_batch`, with
the VAE's scaling and shift factors. Assumes a diffusers pipeline with `vae` and `image_processor`; a family whose
latents are packed (FLUX, Qwen-Image) overrides `decode`/`encode_pixels` around these.

Reads from the family: `pipeline`, `device`, `vae_decode_batch`.
"""

from __future__ import annotations

import torch


class VaeCodec:
    """Latents <-> images (see the module)."""

    def decode_batch(self, chunk: int | None = None) -> int:
        """Images per VAE decode call: `chunk`, else the recipe's `vae_decode_batch` (8 by default)."""
        return chunk or getattr(self, "vae_decode_batch", 8)

    def latent_stats(self, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """A Wan-style VAE's per-channel latents_mean and latents_std (Qwen-Image's, Wan's), [1, C, 1, 1, 1]."""
        config = self.pipeline.vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(self.device, dtype)
        std = torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(self.device, dtype)
        return mean, std

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int | None = None):
        """Scaled latents -> PIL images (VAE decode in chunks of `decode_batch(chunk)`)."""
        images = []
        vae, chunk = self.pipeline.vae, self.decode_batch(chunk)
        for start in range(0, latents.shape[0], chunk):
            part = latents[start : start + chunk].to(vae.dtype) / vae.config.scaling_factor
            if getattr(vae.config, "shift_factor", None) is not None:
                part = part + vae.config.shift_factor
            decoded = vae.decode(part).sample
            images += self.pipeline.image_processor.postprocess(decoded, output_type="pil")
        return images

    @torch.no_grad()
    def encode_images(self, images) -> torch.Tensor:
        """PIL images -> scaled VAE latents (the posterior mean), float32: the inverse of `decode`."""
        return self.encode_pixels(self.pipeline.image_processor.preprocess(images))

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] -> scaled VAE latents [B, C, h, w] (the posterior mean), float32:
        (mean - shift_factor) * scaling_factor. Precache stores these (`PipelineImageEncoder`)."""
        vae = self.pipeline.vae
        latents = vae.encode(pixels.to(self.device, vae.dtype)).latent_dist.mean.float()
        if getattr(vae.config, "shift_factor", None) is not None:
            latents = latents - vae.config.shift_factor
        return latents * vae.config.scaling_factor
