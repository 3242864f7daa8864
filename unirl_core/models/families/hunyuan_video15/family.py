"""HunyuanVideo 1.5 text-to-video (`HunyuanVideo15Pipeline`): a dual-stream 3-D DiT (`HunyuanVideo15Transformer3DModel`,
patch 1) predicting the flow velocity over video latents [B, C, F, h, w], and the causal video VAE
(`AutoencoderKLHunyuanVideo15`: 16x spatial, 4x temporal, so F = (num_frames - 1) / 4 + 1; latents scaled by
`scaling_factor`, no shift).

| piece      | what the stock pipeline does                              | here                                          |
|------------|-----------------------------------------------------------|-----------------------------------------------|
| text       | Qwen2.5-VL's third-last hidden states of the prompt in a  | the same (`encode_prompt`), kept per prompt   |
|            | system template, padded to 1000 tokens after a 108-token  | at the padded lengths with both masks; a      |
|            | crop (mask); ByT5 over the prompt's quoted texts, padded  | batch's streams are cut to its longest text   |
|            | to 256 (zeros and mask 0 when it quotes nothing)           | (padding is masked out in every attention)    |
| image      | 729 zero image tokens (`image_embeds`), masked out (t2v)  | no image tokens: the same, masked tokens gone |
| input      | [latents, zero condition latents, zero mask] (2C + 1 ch.) | the same                                      |
| schedule   | sigmas linspace(1, 0, n + 1)[:-1], shifted (`shift`)      | the same, read from the scheduler             |
| timestep   | 1000 sigma in the transformer's dtype                     | the same                                      |
| CFG        | the `guider` component: cond and uncond in two forwards,  | both halves in one forward; the recipe's      |
|            | scale from its config                                      | `guidance_scale`, the guider's formulation    |
|            |                                                           | and `guidance_rescale` (`guided`)             |
| VAE        | x / scaling_factor, decoded in one call                   | one video per VAE call (see `decode`)         |

Dropping padded text and the masked image tokens is exact (tested against the stock pipeline): masked keys get no
weight, text tokens carry no RoPE, and the token refiner pools over the mask. It matters at training resolutions,
where the stock's 1985 text tokens can outnumber the video's.

Rollouts sample with Flow-GRPO's SDE (`flow_sde_step`) along the scheduler's sigmas; the Euler step and the SDE are
elementwise, so the video axis changes neither. Outputs are `Video`s (frames as PIL images, `sampling.fps`).
HunyuanVideo15Pipeline has no LoRA loader: `export_adapter` writes peft's form and diffusers' LoRA file, which
`pipe.transformer.load_lora_adapter(folder, weight_name="pytorch_lora_weights.safetensors", prefix="transformer")`
loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.data.video import Video
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family

# the pipeline's padded text lengths (`tokenizer_max_length`, `tokenizer_2_max_length`): the cached conditioning's
MLLM_TOKENS, GLYPH_TOKENS = 1000, 256
CONDITIONING_KEYS = ("embeds", "mask", "glyph_embeds", "glyph_mask")  # the packed order


class HunyuanVideo15Family(Family):
    name, pipeline_class, denoiser_name = "hunyuan_video15", "HunyuanVideo15Pipeline", "transformer"
    latent_stride = 16  # VAE 16 x patch 1
    temporal_stride = 4  # pixel frames per latent frame after the first: (num_frames - 1) % 4 == 0
    outputs = "video"
    condition_mode = "none"  # text-to-video: image-to-video is HunyuanVideo15ImageToVideoPipeline, another family
    text_only_skip = ("transformer", "vae")
    guidance = "CFG (the folder guider's formulation and rescale)"
    fps = 24.0  # HunyuanVideo 1.5's native frame rate (its generate.py); `build_family` sets `sampling.fps`
    num_frames = 121  # its default length; `build_family` sets `sampling.num_frames`
    # HunyuanVideo15Pipeline has no LoRA loader: HunyuanVideoPipeline's writes the same `transformer.` LoRA file, which
    # `pipe.transformer.load_lora_adapter(folder, weight_name="pytorch_lora_weights.safetensors", prefix="transformer")`
    # loads
    lora_pipeline_class = "HunyuanVideoPipeline"

    def __init__(self, path: str, *args, **kwargs):
        super().__init__(path, *args, **kwargs)
        guider = getattr(self.pipeline, "guider", None)
        if guider is not None and (guider.config.start, guider.config.stop) != (0.0, 1.0):
            raise ValueError(f"{path}: guider start/stop {guider.config.start}/{guider.config.stop} (CFG on some "
                             "steps only) is not supported: set them to 0.0/1.0 in guider/config.json")  # fmt: skip

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.hunyuan_video15.tiny import build_hunyuan_video15

        return build_hunyuan_video15()

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.trainable.transformer_blocks)

    # --- text conditioning --------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        """{"embeds": [B, 1000, D], "mask": [B, 1000], "glyph_embeds": [B, 256, E], "glyph_mask": [B, 256]}: the
        pipeline's `encode_prompt` (Qwen2.5-VL in its template; ByT5 over the quoted texts), masks int64."""
        pipe = self.pipeline
        assert (pipe.tokenizer_max_length, pipe.tokenizer_2_max_length) == (MLLM_TOKENS, GLYPH_TOKENS)
        embeds, mask, glyph, glyph_mask = pipe.encode_prompt(texts, device=self.text_device, batch_size=len(texts))
        return {"embeds": embeds, "mask": mask.long(), "glyph_embeds": glyph, "glyph_mask": glyph_mask.long()}

    def pack_conditioning(self, cond: dict) -> torch.Tensor:
        """The conditioning -> [B, rows, D]: each prompt's parts flattened in `CONDITIONING_KEYS` order (masks
        0/1: exact in any dtype), zero-filled to whole rows of D (the first 1000 rows are the embeds)."""
        embeds = cond["embeds"]
        flat = torch.cat([cond[k].to(embeds.dtype).flatten(1) for k in CONDITIONING_KEYS], dim=1)
        flat = torch.nn.functional.pad(flat, (0, -flat.shape[1] % embeds.shape[-1]))
        return flat.view(flat.shape[0], -1, embeds.shape[-1])

    @classmethod
    def unpack_conditioning(cls, packed: torch.Tensor, path: str) -> dict:
        width = packed.shape[-1]
        glyph_width = json.loads((Path(path) / "text_encoder_2" / "config.json").read_text())["d_model"]
        sizes = [MLLM_TOKENS * width, MLLM_TOKENS, GLYPH_TOKENS * glyph_width, GLYPH_TOKENS]
        embeds, mask, glyph, glyph_mask = packed.flatten(-2)[..., : sum(sizes)].split(sizes, dim=-1)
        return {
            "embeds": embeds.unflatten(-1, (MLLM_TOKENS, width)), "mask": mask.round().long(),
            "glyph_embeds": glyph.unflatten(-1, (GLYPH_TOKENS, glyph_width)), "glyph_mask": glyph_mask.round().long(),
        }  # fmt: skip

    def _text(self, cond: dict) -> dict:
        """The transformer's text inputs for a batch: each stream cut after the batch's last unmasked token."""
        inputs = {}
        for embeds, mask, suffix in (("embeds", "mask", ""), ("glyph_embeds", "glyph_mask", "_2")):
            mask_BL = cond[mask].to(self.device)
            positions = torch.arange(1, mask_BL.shape[1] + 1, device=self.device)
            length = int((mask_BL * positions).max())
            inputs[f"encoder_hidden_states{suffix}"] = cond[embeds][:, :length].to(self.device, self.dtype)
            inputs[f"encoder_attention_mask{suffix}"] = mask_BL[:, :length].to(self.dtype)
        return inputs

    # --- latents ------------------------------------------------------------------------------------------------

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        factor = self.pipeline.vae_scale_factor_spatial
        return self.pipeline.vae.config.latent_channels, height // factor, width // factor

    def sample_shape(self, sampling) -> tuple[int, ...]:
        """[C, F, h, w] of one video of `sampling.num_frames` frames at `sampling.height` x `sampling.width`."""
        channels, h, w = self.latent_shape(sampling.height, sampling.width)
        return channels, ((sampling.num_frames or 1) - 1) // self.pipeline.vae_scale_factor_temporal + 1, h, w

    # --- scheduler and sampler ----------------------------------------------------------------------------------

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[float]:
        """The pipeline's sigmas: linspace(1, 0, n + 1)[:-1] through the scheduler (its `shift`), then 0."""
        self.pipeline.scheduler.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1], device="cpu")
        return [float(s) for s in self.pipeline.scheduler.sigmas]

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """(1 - s) x0 + s noise at sigma s = schedule[index]."""
        sigma = schedule[index]
        return (1 - sigma) * clean + sigma * noise

    def velocity(self, x: torch.Tensor, sigma_B: torch.Tensor, cond: dict) -> torch.Tensor:
        """The transformer's output on x [B, C, F, h, w] at per-sample sigmas [B]: the input is [x, zero condition
        latents, zero mask] (text-to-video), the timestep 1000 sigma in the model dtype (as the pipeline casts it),
        no image tokens (the pipeline's are zeros, masked out)."""
        x = x.to(self.dtype)
        zeros = torch.zeros_like(x)
        image_width = self.pipeline.transformer.config.image_embed_dim
        return self.trainable(
            hidden_states=torch.cat([x, zeros, zeros[:, :1]], dim=1), timestep=(sigma_B * 1000.0).to(self.dtype),
            image_embeds=x.new_zeros((x.shape[0], 0, image_width)), return_dict=False, **self._text(cond),
        )[0]  # fmt: skip

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        inputs = torch.cat([x, x]) if self.cfg else x
        sigma_B = torch.full((inputs.shape[0],), schedule[index], dtype=torch.float32, device=self.device)
        velocity = self.velocity(inputs, sigma_B, cond)
        return self.flow_step(
            self.guided(velocity, sampling), x, index, eta, schedule, prev_sample=prev_sample,
            generator=generator, sampling=sampling,
        )  # fmt: skip

    # --- classifier-free guidance -------------------------------------------------------------------------------

    def guided(self, output: torch.Tensor, sampling=None) -> torch.Tensor:
        """[negative, positive] outputs -> float32, as the folder's guider (`ClassifierFreeGuidance`) combines them
        with the recipe's scale s: uncond + s (cond - uncond), or cond + s (cond - uncond) with its
        `use_original_formulation`, then its `guidance_rescale` (`rescale_noise_cfg`; 0 in the published folders)."""
        if not self.cfg:
            return output.float()
        from diffusers.guiders.guider_utils import rescale_noise_cfg

        uncond, cond = self.cfg_halves(output, sampling)
        guider = getattr(self.pipeline, "guider", None)
        config = guider.config if guider is not None else {}
        guided = (cond if config.get("use_original_formulation") else uncond) + self.guidance_scale * (cond - uncond)
        rescale = config.get("guidance_rescale", 0.0)
        return rescale_noise_cfg(guided, cond, rescale) if rescale > 0 else guided

    # --- VAE ----------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int | None = None) -> list[Video]:
        """Scaled latents [B, C, F, h, w] -> `Video`s: z = x / scaling_factor, one video per VAE call whatever
        `vae_decode_batch` says (diffusers' AutoencoderKLHunyuanVideo15 mid-block attention broadcasts its causal
        mask [B, S, S] against [B, 1, S, S] and fails for B > 1)."""
        vae, videos = self.pipeline.vae, []
        for latent in latents.split(1):
            decoded = vae.decode(latent.to(self.device, vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
            (frames,) = self.pipeline.video_processor.postprocess_video(decoded, output_type="pil")
            videos.append(Video(tuple(frames), fps=float(self.fps)))
        return videos

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, F, H, W] (or [B, 3, H, W]: one frame) in [-1, 1] -> scaled latents float32: posterior
        mean x scaling_factor, one video per VAE call (see `decode`)."""
        vae = self.pipeline.vae
        video = pixels if pixels.ndim == 5 else pixels[:, :, None]
        means = [vae.encode(v.to(self.device, vae.dtype)).latent_dist.mean for v in video.split(1)]
        return (torch.cat(means) * vae.config.scaling_factor).float()

    @torch.no_grad()
    def encode_images(self, images) -> torch.Tensor:
        """PIL images -> one-frame latents [B, C, 1, h, w] (precache)."""
        return self.encode_pixels(self.pipeline.video_processor.preprocess(images))

    # --- warm-up ------------------------------------------------------------------------------------------------

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """Rectified flow with shifted logit-normal sigmas, as `WanFamily.denoising_loss` with the scheduler's
        shift: per sample, from `generator` (in this order), u = sigmoid(n), n ~ N(0, 1),
        sigma = shift u / (1 + (shift - 1) u), then noise ~ N(0, I); x = (1 - sigma) x0 + sigma noise,
        loss = mean (v - (noise - x0))^2, float32."""
        x0 = clean_latents.to(self.device, torch.float32)
        u = torch.sigmoid(per_sample(generator, x0.shape[0], lambda g, n: randn((n,), g))).to(self.device)
        shift = self.pipeline.scheduler.config.get("shift") or 1.0
        sigma_B = shift * u / (1 + (shift - 1) * u)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        sigma = sigma_B.view(-1, *([1] * (x0.ndim - 1)))
        velocity = self.velocity((1 - sigma) * x0 + sigma * noise, sigma_B, cond)
        return flow_matching_loss(velocity, noise, x0)
