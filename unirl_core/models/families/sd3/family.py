"""Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`): an MMDiT predicting the flow-matching velocity, two CLIP
text encoders and T5, sampled with Flow-GRPO's SDE (`flow_sde_step`), trained in the warm-up with SD3's
rectified-flow loss."""

from __future__ import annotations

from functools import lru_cache

import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family, PooledConditioning


@lru_cache(maxsize=16)
def pooled_width(path: str) -> int:
    """SD3's pooled width P: the two CLIP projections, concatenated (read from the text encoders' configs)."""
    from transformers import AutoConfig

    return sum(AutoConfig.from_pretrained(path, subfolder=s).projection_dim for s in ("text_encoder", "text_encoder_2"))


class SD3Family(PooledConditioning, Family):
    pooled_width = staticmethod(pooled_width)
    name, pipeline_class, denoiser_name = "sd3", "StableDiffusion3Pipeline", "transformer"
    latent_stride = 16  # VAE 8 x patch 2
    text_only_skip = ("transformer", "vae")

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.sd3.tiny import build_sd3

        return build_sd3()

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.trainable.transformer_blocks)

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        embeds, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=texts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False, device=self.text_device
        )
        return {"embeds": embeds, "pooled": pooled}

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[float]:
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(num_steps, device="cpu")
        return [float(s) for s in scheduler.sigmas]  # num_steps + 1 values, ending at 0

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """(1 - s) x0 + s noise at sigma s = schedule[index]."""
        sigma = schedule[index]
        return (1 - sigma) * clean + sigma * noise

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        sigma = schedule[index]
        inputs = torch.cat([x, x]) if self.cfg else x
        timestep = torch.full((inputs.shape[0],), sigma * 1000.0, device=self.device)
        velocity = self.trainable(
            hidden_states=inputs.to(self.dtype), timestep=timestep, encoder_hidden_states=cond["embeds"],
            pooled_projections=cond["pooled"], return_dict=False,
        )[0]  # fmt: skip
        return self.flow_step(
            self.guided(velocity, sampling), x, index, eta, schedule, prev_sample=prev_sample,
            generator=generator, sampling=sampling,
        )  # fmt: skip

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """SD3's rectified-flow training loss. Per sample, from `generator` (in this order): u = sigmoid(n),
        n ~ N(0, 1) (SD3's logit-normal timestep density), sigma = shift u / (1 + (shift - 1) u) (the scheduler's
        timestep shift, as diffusers' SD3 training samples its shifted sigmas), then noise ~ N(0, I);
        x = (1 - sigma) x0 + sigma noise, loss = mean (v - (noise - x0))^2, unweighted, float32."""
        x0 = clean_latents.to(self.device, torch.float32)
        u = torch.sigmoid(per_sample(generator, x0.shape[0], lambda g, n: randn((n,), g))).to(self.device)
        shift = self.pipeline.scheduler.config.shift
        sigma = shift * u / (1 + (shift - 1) * u)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        sigma_B111 = sigma.view(-1, 1, 1, 1)
        x = (1 - sigma_B111) * x0 + sigma_B111 * noise
        velocity = self.trainable(
            hidden_states=x.to(self.dtype), timestep=sigma * 1000.0,
            encoder_hidden_states=cond["embeds"].to(self.device, self.dtype),
            pooled_projections=cond["pooled"].to(self.device, self.dtype), return_dict=False,
        )[0]  # fmt: skip
        return flow_matching_loss(velocity, noise, x0)
