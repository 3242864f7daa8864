"""FLUX.1 (`FluxPipeline`, `FluxKontextPipeline`): a rectified-flow MMDiT over 2x2-packed VAE latents, CLIP's
pooled output + T5's token embeddings, sampled with Flow-GRPO's SDE (`flow_sde_step`) on the pipeline's
dynamically shifted sigmas.

| family       | model                  | guidance                                    | steps | T5 tokens | condition image  |
|--------------|------------------------|---------------------------------------------|-------|-----------|------------------|
| flux         | FLUX.1-dev             | distilled: `guidance_scale` -> embedding    | 28    | 512       | -                |
| flux_schnell | FLUX.1-schnell         | none (timestep-distilled)                   | 4     | 256       | -                |
| flux_kontext | FLUX.1-Kontext-dev     | distilled: `guidance_scale` -> embedding    | 28    | 512       | "reference"      |

FLUX.1-dev and Kontext-dev are guidance-distilled: the transformer takes the guidance scale as an input (`guidance`,
embedded like the timestep) and the pipelines run NO negative branch by default (their `true_cfg_scale` is 1). So
`cfg` is always False here and the recipe's `sampling.guidance_scale` is the embedded guidance (3.5 for dev as the
pipeline's default and Flow-GRPO's FLUX configs, 2.5 for Kontext in Flow-GRPO's `counting_flux_kontext`);
`negative_prompt` is unused.

Latents stay unpacked ([B, C, h, w], C = in_channels / 4) outside: `transition` and `denoising_loss` pack them into
2x2 patches ([B, h/2 * w/2, 4C]) for the transformer and unpack its output, as the pipeline's `_pack_latents` /
`_unpack_latents`. The Euler step and the SDE are elementwise, and log-probs are means over all non-batch elements,
so packing changes neither.
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

import numpy as np
import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family, PooledConditioning

# Flow-GRPO's FLUX LoRA (scripts/train_flux.py, r=64, alpha=128): the joint blocks' image and text attention
# projections and both feed-forwards; "attn.to_q/k/v" also match the single blocks' attention
FLOW_GRPO_LORA_TARGETS = (
    "attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj",
    "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2",
)  # fmt: skip

# The published FLUX.1 transformer (transformer/config.json): FluxTransformer2DModel's defaults, which diffusers'
# scripts/convert_flux_to_diffusers.py instantiates for the BFL checkpoints; dev and Kontext-dev carry the guidance
# embedder (`guidance_in`, which diffusers' single_file_utils uses to tell dev from schnell), schnell does not.
_FLUX1_TRANSFORMER = dict(
    patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38, attention_head_dim=128,
    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, axes_dims_rope=(16, 56, 56),
)  # fmt: skip


@lru_cache(maxsize=16)
def pooled_width(path: str) -> int:
    """The pooled width P: CLIPTextModel's hidden size (its pooler output), read from the text encoder's config."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, subfolder="text_encoder").hidden_size


def resolution_shift(image_seq_len: int, config) -> float:
    """FLUX's mu: the pipeline's `calculate_shift` (linear in the packed token count) with the scheduler config's
    base/max sequence lengths and shifts."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    return calculate_shift(
        image_seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.5), config.get("max_shift", 1.15),
    )  # fmt: skip


def pack(latents_BChw: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, h/2 * w/2, 4C]: 2x2 patches, row-major, channels (c, dy, dx) within a token."""
    B, C, h, w = latents_BChw.shape
    patches = latents_BChw.view(B, C, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(B, (h // 2) * (w // 2), 4 * C)


def unpack(tokens_BND: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """`pack`'s inverse: [B, h/2 * w/2, 4C] -> [B, C, h, w]."""
    B, _, D = tokens_BND.shape
    patches = tokens_BND.view(B, h // 2, w // 2, D // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return patches.reshape(B, D // 4, h, w)


def image_ids(h: int, w: int, index: int = 0) -> torch.Tensor:
    """RoPE ids [h/2 * w/2, 3] of a packed latent: (index, row, column); index 1 marks Kontext's condition image."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 0] = index
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3)


class FluxFamily(PooledConditioning, Family):
    pooled_width = staticmethod(pooled_width)
    name, pipeline_class, denoiser_name = "flux", "FluxPipeline", "transformer"
    latent_stride = 16  # VAE 8 x patch 2 (the tiny VAE's 2 x 2 = 4 divides it: any valid size works there too)
    text_only_skip = ("transformer", "vae")
    guidance = "embedded (distilled), no CFG"
    cfg_branch = False  # `guidance_scale` is embedded (dev, Kontext) or unused (schnell)
    max_tokens: ClassVar[int] = 512  # T5 tokens: FluxPipeline's default (FLUX.1-dev)
    lora_targets: ClassVar[tuple[str, ...]] = FLOW_GRPO_LORA_TARGETS
    denoiser_configs: ClassVar[dict[str, dict]] = {"flux1-dev": {**_FLUX1_TRANSFORMER, "guidance_embeds": True}}

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.flux.tiny import build_flux

        return build_flux()

    def blocks(self) -> list[torch.nn.Module]:
        return [*self.trainable.transformer_blocks, *self.trainable.single_transformer_blocks]

    # --- text conditioning --------------------------------------------------------------------------------------

    @property
    def max_sequence_length(self) -> int:
        """T5 tokens per prompt: `max_tokens`, capped by the T5 tokenizer's `model_max_length` (512 for the real
        models: no cap; the tiny models' 64 keeps their joint attention short)."""
        return min(self.max_tokens, self.pipeline.tokenizer_2.model_max_length)

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        """{"embeds": T5 [B, max_sequence_length, D] (padded to max length), "pooled": CLIP pooled [B, P]}."""
        embeds, pooled, _ = self.pipeline.encode_prompt(
            prompt=texts, prompt_2=None, device=self.text_device, max_sequence_length=self.max_sequence_length
        )
        return {"embeds": embeds, "pooled": pooled}

    # --- latents ------------------------------------------------------------------------------------------------

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """(C, h, w) of the unpacked latent, sized as the pipeline's `prepare_latents` (even h, w)."""
        factor = self.pipeline.vae_scale_factor
        channels = self.trainable.config.in_channels // 4
        return channels, 2 * (height // (factor * 2)), 2 * (width // (factor * 2))

    # --- scheduler and sampler ----------------------------------------------------------------------------------

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[float]:
        """The pipeline's sigmas: linspace(1, 1/n, n) shifted by mu (the packed token count h/2 * w/2, see
        `resolution_shift`) when the scheduler shifts dynamically, by its fixed `shift` otherwise; then 0."""
        scheduler = self.pipeline.scheduler
        _, h, w = latent_shape[-3:]
        mu = resolution_shift((h // 2) * (w // 2), scheduler.config)
        if scheduler.config.get("use_flow_sigmas", False):  # the pipeline lets such a scheduler pick its sigmas
            scheduler.set_timesteps(num_steps, device="cpu", mu=mu)
        else:
            scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), device="cpu", mu=mu)
        return [float(s) for s in scheduler.sigmas]  # num_steps + 1 values, ending at 0

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """(1 - s) x0 + s noise at sigma s = schedule[index]."""
        sigma = schedule[index]
        return (1 - sigma) * clean + sigma * noise

    def velocity(self, x_BChw: torch.Tensor, timestep_B: torch.Tensor, cond: dict) -> torch.Tensor:
        """The transformer's velocity on unpacked latents (float32 [B, C, h, w]); `timestep_B` is sigma in [0, 1]
        (the pipeline passes its timesteps / 1000). With `cond["reference"]` ([B, C, h', w'], Kontext) the condition
        latents' tokens follow the noisy ones, ids (1, row, column); the output keeps the noisy tokens."""
        B, _, h, w = x_BChw.shape
        tokens, ids = pack(x_BChw), image_ids(h, w)
        reference = cond.get("reference")
        if reference is not None:
            tokens = torch.cat([tokens, pack(reference.to(x_BChw.device, x_BChw.dtype))], dim=1)
            ids = torch.cat([ids, image_ids(*reference.shape[-2:], index=1)])
        guidance = None
        if self.trainable.config.guidance_embeds:
            guidance = torch.full((B,), self.guidance_scale, device=self.device, dtype=torch.float32)
        embeds = cond["embeds"].to(self.device, self.dtype)
        output = self.trainable(
            hidden_states=tokens.to(self.dtype), timestep=timestep_B.to(self.device, self.dtype), guidance=guidance,
            pooled_projections=cond["pooled"].to(self.device, self.dtype), encoder_hidden_states=embeds,
            txt_ids=torch.zeros(embeds.shape[1], 3, device=self.device, dtype=self.dtype),
            img_ids=ids.to(self.device, self.dtype), return_dict=False,
        )[0]  # fmt: skip
        return unpack(output[:, : (h // 2) * (w // 2)].float(), h, w)

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        sigma = schedule[index]
        # the pipeline's float32 timestep t = 1000 sigma, divided by 1000 again on the way in
        timestep = torch.full((x.shape[0],), sigma, dtype=torch.float32) * 1000.0
        velocity = self.velocity(x.float(), timestep.to(self.dtype) / 1000.0, cond)
        return self.flow_step(velocity, x, index, eta, schedule, prev_sample=prev_sample, generator=generator,
                              sampling=sampling)  # fmt: skip

    # --- warm-up ------------------------------------------------------------------------------------------------

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """The rectified-flow training loss of diffusers' train_dreambooth_lora_flux.py (weighting_scheme
        logit_normal, mean 0, std 1: unweighted), on sigmas shifted as the sampler shifts them. Per sample, from
        `generator` (in this order): u = sigmoid(n), n ~ N(0, 1), then noise ~ N(0, I); sigma = the scheduler's
        time_shift(mu, 1, u) = e^mu / (e^mu + 1/u - 1) with mu from the latent's token count (`resolution_shift`),
        or shift u / (1 + (shift - 1) u) for a scheduler without dynamic shifting (schnell: shift 1, sigma = u).
        (diffusers' script indexes its scheduler's unshifted training table with u instead; we train at the noise
        levels the rollouts visit.) x = (1 - sigma) x0 + sigma noise, loss = mean (v - (noise - x0))^2 over the
        unpacked latents, float32, with the recipe's guidance scale in the guidance embedding."""
        x0 = clean_latents.to(self.device, torch.float32)
        u = torch.sigmoid(per_sample(generator, x0.shape[0], lambda g, n: randn((n,), g))).to(self.device)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        scheduler = self.pipeline.scheduler
        if scheduler.config.use_dynamic_shifting:
            mu = resolution_shift((x0.shape[-2] // 2) * (x0.shape[-1] // 2), scheduler.config)
            sigma = scheduler.time_shift(mu, 1.0, u)
        else:
            shift = scheduler.config.shift
            sigma = shift * u / (1 + (shift - 1) * u)
        sigma_B111 = sigma.view(-1, 1, 1, 1)
        x = (1 - sigma_B111) * x0 + sigma_B111 * noise
        return flow_matching_loss(self.velocity(x, sigma, cond), noise, x0)


class FluxSchnellFamily(FluxFamily):
    """FLUX.1-schnell: timestep-distilled (4 steps), no guidance embedding, no dynamic shift, 256 T5 tokens."""

    name = "flux_schnell"
    guidance = "none (timestep-distilled)"
    max_tokens = 256  # the schnell model card's `max_sequence_length=256`
    denoiser_configs = {"flux1-schnell": {**_FLUX1_TRANSFORMER, "guidance_embeds": False}}

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.flux.tiny import build_flux_schnell

        return build_flux_schnell()


class FluxKontextFamily(FluxFamily):
    """FLUX.1-Kontext-dev (`FluxKontextPipeline`): an edit model. The condition image's scaled latents ride in
    `cond["reference"]` (the base `with_condition_images`) and `velocity` packs them after the noisy tokens with
    image ids (1, row, column), as the pipeline; mu counts the noisy tokens only, as the pipeline's. The condition
    image arrives cropped and resized to the rollout's size (the stock pipeline's `_auto_resize=False` with
    `max_area` = height x width; its default snaps it to a preferred Kontext resolution instead). The warm-up
    (`denoising_loss`) has no condition images: it trains the text-to-image path."""

    name, pipeline_class = "flux_kontext", "FluxKontextPipeline"
    condition_mode = "reference"
    denoiser_configs = {"flux1-kontext-dev": {**_FLUX1_TRANSFORMER, "guidance_embeds": True}}

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.flux.tiny import build_flux_kontext

        return build_flux_kontext()
