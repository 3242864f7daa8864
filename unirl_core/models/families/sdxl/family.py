"""Stable Diffusion XL (`StableDiffusionXLPipeline`): a UNet predicting epsilon with SDXL's "text_time" added
conditioning, two CLIP text encoders, sampled with DDIM and eta (DDPO's sampler, `ddim_step`) and trained in the
warm-up with DDPM's epsilon loss, like sd15.

| conditioning | shape                 | what                                                                          |
|--------------|-----------------------|-------------------------------------------------------------------------------|
| embeds       | [B, 77, 768 + 1280]   | both encoders' penultimate hidden states, concatenated                        |
| pooled       | [B, 1280]             | text_encoder_2's projected text embedding (`added_cond_kwargs["text_embeds"]`) |
| time ids     | [B, 6], not stored    | (h, w, 0, 0, h, w): original size, crop top-left, target size, from x's shape |

Sampler: SDXL ships EulerDiscreteScheduler; the family samples with `DDIMScheduler.from_config(<that config>)`, what
diffusers does to swap a scheduler: SDXL base's config gives "leading" spacing with steps_offset 1 (50 steps: 981,
961, ..., 1), set_alpha_to_one false, clip_sample false. The pipeline's own scheduler is left as it is (exports keep
Euler). CFG follows the pipeline's `force_zeros_for_empty_prompt` (true for SDXL base): with no negative prompt
(ours: "") the negative half is zeros, embeds and pooled. A float16 model keeps its VAE in float32 (`force_upcast`:
SDXL's VAE overflows in float16; the pipeline upcasts it to decode).
"""

from __future__ import annotations

from functools import lru_cache
from typing import ClassVar

import torch

from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family, PooledConditioning

# stabilityai/stable-diffusion-xl-base-1.0 unet/config.json (diffusers 0.19 export; the defaults of diffusers 0.42
# left out): 2816 = pooled 1280 + 6 time ids x 256
SDXL_BASE_UNET = {
    "act_fn": "silu",
    "addition_embed_type": "text_time",
    "addition_embed_type_num_heads": 64,
    "addition_time_embed_dim": 256,
    "attention_head_dim": [5, 10, 20],
    "block_out_channels": [320, 640, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 2048,
    "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "projection_class_embeddings_input_dim": 2816,
    "sample_size": 128,
    "time_embedding_type": "positional",
    "transformer_layers_per_block": [1, 2, 10],
    "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    "use_linear_projection": True,
}


@lru_cache(maxsize=16)
def pooled_width(path: str) -> int:
    """SDXL's pooled width: text_encoder_2's projection (1280 for SDXL base)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, subfolder="text_encoder_2").projection_dim


class SDXLFamily(PooledConditioning, Family):
    pooled_width = staticmethod(pooled_width)
    name, pipeline_class, denoiser_name = "sdxl", "StableDiffusionXLPipeline", "unet"
    latent_stride = 8  # VAE 8 (the tiny VAE's 2 is read from the pipeline's vae_scale_factor in latent_shape)
    text_only_skip = ("unet", "vae", "image_encoder", "feature_extractor")
    sampler = "DDIM + eta"
    sampler_kind = "ddim"  # `sde` is the DDIM eta sampler here
    schedule_indexed = False  # the next timestep is DDIMScheduler.step's t - 1000 // n, not the schedule's next entry
    # diffusers' examples/dreambooth/train_dreambooth_lora_sdxl.py (the UNet's attention projections)
    lora_targets: ClassVar[tuple[str, ...]] = ("to_k", "to_q", "to_v", "to_out.0")
    denoiser_configs: ClassVar[dict[str, dict]] = {"sdxl-base-1.0": SDXL_BASE_UNET}

    def __init__(self, path: str, *args, **kwargs):
        from diffusers import DDIMScheduler

        super().__init__(path, *args, **kwargs)
        vae = self.pipeline.vae
        if vae is not None and vae.dtype == torch.float16 and vae.config.force_upcast:
            vae.to(torch.float32)  # decode and encode in float32, as the pipeline decodes
        # DDPO's sampler on SDXL's noise schedule
        self.scheduler = DDIMScheduler.from_config(self.pipeline.scheduler.config)
        config = self.scheduler.config
        if config.prediction_type != "epsilon":
            raise ValueError(
                f"{path}: scheduler prediction_type={config.prediction_type!r}: the sdxl family samples and trains "
                "epsilon prediction only"
            )
        if config.clip_sample or config.thresholding:  # ddim_step never clips x0
            raise ValueError(
                f"{path}: the scheduler config clips or thresholds x0 in DDIM (clip_sample={config.clip_sample}, "
                f"thresholding={config.thresholding}); the sdxl family's DDIM step does neither: set them false"
            )

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.sdxl.tiny import build_sdxl

        return build_sdxl()

    def blocks(self) -> list[torch.nn.Module]:
        unet = self.trainable
        return [*unet.down_blocks, unet.mid_block, *unet.up_blocks]

    # --- text conditioning ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        embeds, _, pooled, _ = self.pipeline.encode_prompt(
            texts, device=self.text_device, num_images_per_prompt=1, do_classifier_free_guidance=False
        )
        return {"embeds": embeds, "pooled": pooled}

    def encode(self, prompts: list[str]) -> dict:
        """[negative, positive]; with no negative prompt and `force_zeros_for_empty_prompt`, the negative half is
        zeros (the pipeline called without `negative_prompt`)."""
        cond = super().encode(prompts)
        if not (self.cfg and self.negative_prompt == "" and self.pipeline.config.force_zeros_for_empty_prompt):
            return cond
        positives = {k: v.chunk(2)[1] for k, v in cond.items()}
        return {k: torch.cat([torch.zeros_like(v), v]) for k, v in positives.items()}

    # --- the UNet -------------------------------------------------------------------------------------------------

    def time_ids(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, 6] = (h, w, 0, 0, h, w) in pixels: `_get_add_time_ids` with the pipeline's defaults (original and
        target size = the image size, no crop)."""
        h, w = (side * self.pipeline.vae_scale_factor for side in latents.shape[-2:])
        ids = torch.tensor([h, w, 0, 0, h, w], device=self.device, dtype=self.dtype)
        return ids.expand(latents.shape[0], -1)

    def eps(self, x: torch.Tensor, t: torch.Tensor, cond: dict) -> torch.Tensor:
        """The UNet's epsilon on x [B,C,h,w] at timesteps t [B] (no guidance)."""
        added = {"text_embeds": cond["pooled"].to(self.device, self.dtype), "time_ids": self.time_ids(x)}
        return self.trainable(
            x.to(self.dtype), t, encoder_hidden_states=cond["embeds"].to(self.device, self.dtype),
            added_cond_kwargs=added, return_dict=False,
        )[0]  # fmt: skip

    # --- scheduler and sampler ------------------------------------------------------------------------------------

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[int]:
        self.scheduler.set_timesteps(num_steps, device="cpu")
        return [int(t) for t in self.scheduler.timesteps] + [-1]

    def alpha_prod(self, t: int) -> float:
        """alpha-bar at timestep t; t < 0 is the end of sampling (`final_alpha_cumprod`)."""
        scheduler = self.scheduler
        return scheduler.alphas_cumprod[t].item() if t >= 0 else scheduler.final_alpha_cumprod.item()

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """sqrt(a_t) x0 + sqrt(1 - a_t) noise at t = schedule[index]."""
        alpha = self.alpha_prod(schedule[index])
        return alpha**0.5 * clean + (1 - alpha) ** 0.5 * noise

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        """DDIM from t to t - 1000 // num_steps, as `DDIMScheduler.step` (the next timestep with leading spacing)."""
        t = schedule[index]
        t_prev = t - self.scheduler.config.num_train_timesteps // (len(schedule) - 1)
        inputs = torch.cat([x, x]) if self.cfg else x
        eps = self.eps(inputs, torch.full((inputs.shape[0],), t, device=self.device), cond)
        return self.sampler_of(sampling).step(
            self.guided(eps, sampling), x, self.alpha_prod(t), self.alpha_prod(t_prev), eta, prev_sample=prev_sample,
            generator=generator,
        )  # fmt: skip

    # --- warm-up --------------------------------------------------------------------------------------------------

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """DDPM's epsilon loss with SDXL's time ids. Per sample, from `generator` (in this order): t uniform in
        [0, num_train_timesteps), then noise ~ N(0, I); x_t = sqrt(a_t) x0 + sqrt(1 - a_t) noise,
        loss = mean (eps - noise)^2, unweighted, float32."""
        scheduler = self.scheduler  # epsilon prediction (checked on loading)
        x0 = clean_latents.to(self.device, torch.float32)
        steps = scheduler.config.num_train_timesteps
        t = per_sample(generator, x0.shape[0], lambda g, n: torch.randint(0, steps, (n,), generator=g, device=g.device))
        t = t.to(self.device)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        x = scheduler.add_noise(x0, noise, t)
        return torch.nn.functional.mse_loss(self.eps(x, t, cond).float(), noise)
