"""Stable Diffusion 1.x (`StableDiffusionPipeline`): a UNet predicting epsilon, one CLIP text encoder, sampled with
DDIM and eta (DDPO's sampler, `ddim_step`), trained in the warm-up with DDPM's epsilon loss."""

from __future__ import annotations

import torch

from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family


class SD15Family(Family):
    name, pipeline_class, denoiser_name = "sd15", "StableDiffusionPipeline", "unet"
    latent_stride = 8  # VAE 8
    text_only_skip = ("unet", "vae", "safety_checker", "feature_extractor")
    sampler = "DDIM + eta"
    sampler_kind = "ddim"  # `sde` is the DDIM eta sampler here

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.sd15.tiny import build_sd15

        return build_sd15()

    def blocks(self) -> list[torch.nn.Module]:
        unet = self.trainable
        return [*unet.down_blocks, unet.mid_block, *unet.up_blocks]

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        embeds, _ = self.pipeline.encode_prompt(texts, self.text_device, 1, False)
        return {"embeds": embeds}

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[int]:
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(num_steps, device="cpu")
        return [int(t) for t in scheduler.timesteps] + [-1]

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """sqrt(a_t) x0 + sqrt(1 - a_t) noise at t = schedule[index]."""
        alpha = self.pipeline.scheduler.alphas_cumprod[schedule[index]].item()
        return alpha**0.5 * clean + (1 - alpha) ** 0.5 * noise

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        scheduler = self.pipeline.scheduler
        t, t_prev = schedule[index], schedule[index + 1]
        alpha = scheduler.alphas_cumprod[t].item()
        alpha_prev = scheduler.alphas_cumprod[t_prev].item() if t_prev >= 0 else scheduler.final_alpha_cumprod.item()
        inputs = torch.cat([x, x]) if self.cfg else x
        timestep = torch.full((inputs.shape[0],), t, device=self.device)
        eps = self.trainable(inputs.to(self.dtype), timestep, encoder_hidden_states=cond["embeds"], return_dict=False)
        return self.sampler_of(sampling).step(
            self.guided(eps[0], sampling), x, alpha, alpha_prev, eta, prev_sample=prev_sample, generator=generator
        )

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """DDPM's epsilon loss. Per sample, from `generator` (in this order): t uniform in
        [0, num_train_timesteps), then noise ~ N(0, I); x_t = scheduler.add_noise(x0, noise, t),
        loss = mean (eps - noise)^2, unweighted, float32."""
        scheduler = self.pipeline.scheduler
        if scheduler.config.prediction_type != "epsilon":
            raise ValueError(
                f"scheduler prediction_type={scheduler.config.prediction_type!r}: the sd15 family samples and "
                "trains epsilon prediction only"
            )
        x0 = clean_latents.to(self.device, torch.float32)
        steps = scheduler.config.num_train_timesteps
        t = per_sample(generator, x0.shape[0], lambda g, n: torch.randint(0, steps, (n,), generator=g, device=g.device))
        t = t.to(self.device)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        x = scheduler.add_noise(x0, noise, t)
        embeds = cond["embeds"].to(self.device, self.dtype)
        eps = self.trainable(x.to(self.dtype), t, encoder_hidden_states=embeds, return_dict=False)[0]
        return torch.nn.functional.mse_loss(eps.float(), noise)
