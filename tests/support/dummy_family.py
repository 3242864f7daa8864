"""A third model family written against the `Family` contract alone, to show that adding a family is one file.

`dummy_flow` runs on SD3's pipeline classes (the tiny SD3 components) but makes every family choice itself, none of
them SD3Family's:

| choice         | dummy_flow                                                  | sd3 (for contrast)                        |
|----------------|-------------------------------------------------------------|-------------------------------------------|
| schedule       | plain linear sigmas 1 -> 0, no timestep shift               | the scheduler's shifted sigmas            |
| conditioning   | {"text_tokens", "text_pooled"}; packed pooled row *first*   | {"embeds", "pooled"}; pooled row last     |
| unpack width   | the transformer's `pooled_projection_dim`                   | the CLIP encoders' projection widths      |
| warm-up sigma  | uniform in [0, 1)                                           | logit-normal, then shifted                |

Nothing in the loop knows this file: the test registers it (`register(DummyFamily)`) or names it as `module:Class`.
"""

from __future__ import annotations

import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family

TIMESTEP_SCALE = 1000.0  # the SD3 transformer embeds timesteps in [0, 1000]: sigma 1 -> 1000


def interpolate(clean: torch.Tensor, noise: torch.Tensor, sigma) -> torch.Tensor:
    """The rectified-flow path x_sigma = (1 - sigma) x0 + sigma noise (sigma a float or broadcastable tensor)."""
    return (1 - sigma) * clean + sigma * noise


class DummyFamily(Family):
    name, pipeline_class, denoiser_name = "dummy_flow", "StableDiffusion3Pipeline", "transformer"
    latent_stride = 16  # VAE 8 x patch 2 (what a full-size SD3 VAE would give)
    text_only_skip = ("transformer", "vae")

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.sd3.tiny import build_sd3

        return build_sd3()

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.trainable.transformer_blocks)

    # --- text conditioning ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        tokens, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=texts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False, device=self.device
        )
        return {"text_tokens": tokens, "text_pooled": pooled}

    def pack_conditioning(self, cond: dict) -> torch.Tensor:
        """tokens [B,T,D], pooled [B,P] (P <= D) -> [B,1+T,D]: pooled zero-padded to D as the first row."""
        tokens, pooled = cond["text_tokens"], cond["text_pooled"]
        assert pooled.shape[-1] <= tokens.shape[-1], (pooled.shape, tokens.shape)
        row = torch.nn.functional.pad(pooled, (0, tokens.shape[-1] - pooled.shape[-1]))
        return torch.cat([row[:, None, :].to(tokens.dtype), tokens], dim=1)

    @classmethod
    def unpack_conditioning(cls, packed: torch.Tensor, path: str) -> dict:
        from diffusers import SD3Transformer2DModel

        width = SD3Transformer2DModel.load_config(path, subfolder="transformer")["pooled_projection_dim"]
        return {"text_tokens": packed[..., 1:, :], "text_pooled": packed[..., 0, :width]}

    # --- scheduler and sampler -----------------------------------------------------------------------------------

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[float]:
        """num_steps + 1 evenly spaced sigmas from 1 to 0 (the pipeline's scheduler is not consulted)."""
        return [1 - i / num_steps for i in range(num_steps + 1)]

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        return interpolate(clean, noise, schedule[index])

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: dict) -> torch.Tensor:
        """The transformer's velocity on x [B,C,h,w] at per-sample sigmas [B] (no guidance)."""
        return self.trainable(
            hidden_states=x.to(self.dtype), timestep=sigma * TIMESTEP_SCALE,
            encoder_hidden_states=cond["text_tokens"].to(self.device, self.dtype),
            pooled_projections=cond["text_pooled"].to(self.device, self.dtype), return_dict=False,
        )[0]  # fmt: skip

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        inputs = torch.cat([x, x]) if self.cfg else x
        velocity = self.velocity(inputs, torch.full((inputs.shape[0],), schedule[index], device=self.device), cond)
        return self.flow_step(  # the algorithm's sampler (`sampling`), on this family's own schedule
            self.guided(velocity, sampling), x, index, eta, schedule, prev_sample=prev_sample, generator=generator,
            sampling=sampling,
        )  # fmt: skip

    # --- warm-up -------------------------------------------------------------------------------------------------

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """Flow matching with uniform sigmas. Per sample, from `generator` (in this order): sigma ~ U[0, 1), then
        noise ~ N(0, I); x = (1 - sigma) x0 + sigma noise, loss = mean (v - (noise - x0))^2, float32."""
        x0 = clean_latents.to(self.device, torch.float32)
        sigma_B = per_sample(generator, x0.shape[0], lambda g, n: torch.rand((n,), generator=g, device=g.device))
        sigma_B = sigma_B.to(self.device)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        x = interpolate(x0, noise, sigma_B.view(-1, 1, 1, 1))
        return flow_matching_loss(self.velocity(x, sigma_B, cond), noise, x0)
