"""FLUX.2-Klein (`Flux2KleinPipeline`, diffusers 0.42): a Flux2 MMDiT (double- then single-stream blocks) predicting
the flow-matching velocity over packed latent tokens with 4-axis rotary position ids, conditioned on a Qwen3 LLM's
hidden states; sampled with Flow-GRPO's SDE (`flow_sde_step`).

Latents. The FLUX.2 VAE's latent z [B, c, 2h, 2w] is patchified 2x2 to [B, 4c, h, w] and normalized per channel with
the VAE's batch-norm running statistics, (z_p - bn.running_mean) / sqrt(bn.running_var + eps); the pipeline's
initial noise (`prepare_latents`) is drawn in that space, [B, 4c, h, w], then packed to tokens [B, h w, 4c]. The
loop holds exactly that unpacked normalized tensor, so `latent_shape` = (transformer.in_channels, H/16, W/16) and
the same initial noise gives the pipeline's output; `transition` packs and unpacks, `decode` / `encode_images`
apply the inverse / the forward normalization and (un)patchify.

Text. Each prompt goes through Qwen3's chat template (thinking off), padded to `max_sequence_length` (512) tokens;
the hidden states of layers (9, 18, 27) are stacked per token: embeds [B, 512, 3 D]. The denoiser sees the padding
(no attention mask), as in the pipeline; text position ids are (0, 0, 0, token index).

Guidance. No guidance embedding (guidance_embeds False, the pipeline passes guidance=None). The base checkpoints
(is_distilled False) use true CFG with the empty negative prompt, v = v_neg + g (v_pos - v_neg), on when g > 1;
the step-distilled checkpoints (is_distilled True) ignore `guidance_scale` (as the pipeline does, with a warning).

Schedule. sigmas = linspace(1, 1/n, n), shifted by the scheduler's exponential time shift with the pipeline's
`compute_empirical_mu(image_seq_len = h w, n)`, then a final 0.
"""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np
import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family

logger = logging.getLogger(__name__)

# BFL's Klein4BParams / Klein9BParams (black-forest-labs/flux2 src/flux2/model.py, mirrored in kohya-ss/musubi-tuner's
# flux2 model) as diffusers Flux2Transformer2DModel kwargs (scripts/convert_flux2_to_diffusers.py's mapping: hidden =
# heads x 128, context_in_dim -> joint_attention_dim = 3 x Qwen3 hidden); the base and distilled variants share them.
_KLEIN_COMMON = dict(
    patch_size=1, in_channels=128, out_channels=None, attention_head_dim=128, timestep_guidance_channels=256,
    mlp_ratio=3.0, axes_dims_rope=(32, 32, 32, 32), rope_theta=2000, eps=1e-6, guidance_embeds=False,
)  # fmt: skip
_KLEIN_4B = dict(_KLEIN_COMMON, num_layers=5, num_single_layers=20, num_attention_heads=24, joint_attention_dim=7680)
_KLEIN_9B = dict(_KLEIN_COMMON, num_layers=8, num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288)


def compute_empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """The pipeline's resolution- and step-dependent shift mu (diffusers' flux2 `compute_empirical_mu`): linear in
    the sequence length, interpolated in the step count between fits at 10 and 200 steps (above 4300 tokens the
    200-step fit alone)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    mu_200 = a2 * image_seq_len + b2
    if image_seq_len > 4300:
        return float(mu_200)
    mu_10 = a1 * image_seq_len + b1
    slope = (mu_200 - mu_10) / 190.0
    return float(slope * num_steps + mu_200 - 200.0 * slope)


def pack(latents_BCHW: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> tokens [B, h w, C] (row-major, as the pipeline's `_pack_latents`)."""
    B, C, h, w = latents_BCHW.shape
    return latents_BCHW.reshape(B, C, h * w).permute(0, 2, 1)


def unpack(tokens_BLC: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """`pack`'s inverse: [B, h w, C] -> [B, C, h, w]."""
    B, _, C = tokens_BLC.shape
    return tokens_BLC.permute(0, 2, 1).reshape(B, C, h, w)


class Flux2KleinFamily(Family):
    name, pipeline_class, denoiser_name = "flux2_klein", "Flux2KleinPipeline", "transformer"
    latent_stride = 16  # VAE 8 x patchify 2
    text_only_skip = ("transformer", "vae")
    condition_mode = "reference"  # Klein edits: the condition image's tokens join the sequence (time id 10)
    guidance = "true CFG, empty negative (base); none (distilled)"
    max_tokens = 512  # the pipeline's default `max_sequence_length`
    text_encoder_out_layers = (9, 18, 27)  # the pipeline's default: Qwen3 hidden states stacked per token
    # UniRL's FLUX.2-klein GRPO LoRA (Tencent-Hunyuan/UniRL examples/diffusion/flux2_klein/flux2_klein_trainside.yaml):
    # every linear of the double blocks (image and text attention, both feed-forwards) and the single blocks' fused
    # QKV+MLP projection. (The single blocks' `attn.to_out` is left out there: the bare name also matches the double
    # blocks' `attn.to_out` ModuleList; diffusers' train_dreambooth_lora_flux2_klein.py lists it by block index.)
    lora_targets: ClassVar[tuple[str, ...]] = (
        "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
        "ff.linear_in", "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out", "to_qkv_mlp_proj",
    )  # fmt: skip
    denoiser_configs: ClassVar[dict[str, dict]] = {
        "flux2-klein-4b": _KLEIN_4B, "flux2-klein-base-4b": _KLEIN_4B,
        "flux2-klein-9b": _KLEIN_9B, "flux2-klein-base-9b": _KLEIN_9B,
    }  # fmt: skip

    def __init__(self, path: str, *args, **kwargs):
        super().__init__(path, *args, **kwargs)
        if self.guidance_scale > 1.0 and self.pipeline.config.is_distilled:
            logger.warning(
                "guidance_scale %s is ignored: %s is a step-distilled FLUX.2-Klein (is_distilled), sampled without "
                "CFG as its pipeline does; set sampling.guidance_scale: 1.0", self.guidance_scale, path,
            )  # fmt: skip

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.flux2_klein.tiny import build_flux2_klein

        return build_flux2_klein()

    def blocks(self) -> list[torch.nn.Module]:
        return [*self.trainable.transformer_blocks, *self.trainable.single_transformer_blocks]

    @property
    def cfg(self) -> bool:
        """True CFG on the base checkpoints only (the pipeline's `do_classifier_free_guidance`)."""
        return self.guidance_scale > 1.0 and not self.pipeline.config.is_distilled

    @property
    def max_sequence_length(self) -> int:
        """Text tokens per prompt: `max_tokens`, capped by the tokenizer's `model_max_length` (131072 for the real
        Qwen3 tokenizer: 512; the tiny's 96 keeps tiny rollouts short)."""
        return min(self.max_tokens, self.pipeline.tokenizer.model_max_length)

    # --- text ---------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        embeds, _ = self.pipeline.encode_prompt(
            prompt=texts, device=self.text_device, max_sequence_length=self.max_sequence_length,
            text_encoder_out_layers=self.text_encoder_out_layers,
        )  # fmt: skip
        return {"embeds": embeds}  # [B, max_sequence_length, 3 D]

    # --- latents and schedule -----------------------------------------------------------------------------------

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        """(4 c, H / 16, W / 16): the patchified, normalized latent the pipeline draws its noise in."""
        factor = 2 * self.pipeline.vae_scale_factor
        return self.trainable.config.in_channels, height // factor, width // factor

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[float]:
        """The pipeline's sigmas: linspace(1, 1/n, n) through the scheduler with mu = compute_empirical_mu(h w, n)."""
        _, h, w = latent_shape
        scheduler = self.pipeline.scheduler
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        if getattr(scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        mu = compute_empirical_mu(image_seq_len=h * w, num_steps=num_steps)
        scheduler.set_timesteps(sigmas=sigmas, device="cpu", mu=mu)
        return [float(s) for s in scheduler.sigmas]  # num_steps + 1 values, ending at 0

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """(1 - s) x0 + s noise at sigma s = schedule[index]."""
        sigma = schedule[index]
        return (1 - sigma) * clean + sigma * noise

    # --- the denoiser -------------------------------------------------------------------------------------------

    def velocity(self, x_BCHW: torch.Tensor, sigma_B: torch.Tensor, cond: dict) -> torch.Tensor:
        """The transformer's velocity on unpacked latents [B, C, h, w] (float32 out, same shape); with
        `cond["reference"]` (edit), the reference latents' tokens follow the image tokens, at time id 10."""
        pipe, (_, _, h, w) = self.pipeline, x_BCHW.shape
        tokens, ids = pack(x_BCHW), pipe._prepare_latent_ids(x_BCHW)
        if "reference" in cond:
            reference = cond["reference"]
            tokens = torch.cat([tokens, pack(reference)], dim=1)
            ids = torch.cat([ids, pipe._prepare_image_ids([reference[:1]]).expand(len(reference), -1, -1)], dim=1)
        embeds = cond["embeds"].to(self.device, self.dtype)
        output = self.trainable(
            hidden_states=tokens.to(self.dtype), timestep=sigma_B.to(self.dtype), guidance=None,
            encoder_hidden_states=embeds, txt_ids=pipe._prepare_text_ids(embeds).to(self.device),
            img_ids=ids.to(self.device), return_dict=False,
        )[0]  # fmt: skip
        return unpack(output[:, : h * w].float(), h, w)

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        sigma = schedule[index]
        inputs = torch.cat([x, x]) if self.cfg else x
        # the pipeline's timestep: t = 1000 sigma (float32), passed as t / 1000
        timestep = torch.full((inputs.shape[0],), sigma * 1000.0, device=self.device) / 1000
        velocity = self.velocity(inputs, timestep, cond)
        return self.flow_step(
            self.guided(velocity, sampling), x, index, eta, schedule, prev_sample=prev_sample,
            generator=generator, sampling=sampling,
        )  # fmt: skip

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """diffusers' train_dreambooth_lora_flux2_klein.py loss (weighting_scheme "none"). Per sample, from
        `generator` (in this order): sigma ~ U(0, 1), then noise ~ N(0, I); x = (1 - sigma) x0 + sigma noise,
        loss = mean (v - (noise - x0))^2, float32 (the script quantizes sigma to the 1000 training sigmas)."""
        x0 = clean_latents.to(self.device, torch.float32)
        sigma = per_sample(generator, x0.shape[0], lambda g, n: torch.rand((n,), generator=g, device=g.device))
        sigma = sigma.to(self.device)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        sigma_B111 = sigma.view(-1, 1, 1, 1)
        x = (1 - sigma_B111) * x0 + sigma_B111 * noise
        return flow_matching_loss(self.velocity(x, sigma, cond), noise, x0)

    # --- VAE ----------------------------------------------------------------------------------------------------

    def _bn_stats(self):
        """The VAE's batch-norm running mean and std, [1, 4 c, 1, 1] float32: the latent normalization."""
        vae = self.pipeline.vae
        mean = vae.bn.running_mean.view(1, -1, 1, 1).float()
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1).float() + vae.config.batch_norm_eps)
        return mean.to(self.device), std.to(self.device)

    def latents_from_vae(self, raw_BcHW: torch.Tensor) -> torch.Tensor:
        """Raw VAE latents [B, c, 2h, 2w] -> the loop's latents [B, 4c, h, w]: patchify 2x2, then
        (z - bn mean) / bn std (the pipeline's `_encode_vae_image`; also what precached raw latents need)."""
        mean, std = self._bn_stats()
        return (self.pipeline._patchify_latents(raw_BcHW.to(self.device, torch.float32)) - mean) / std

    def latents_to_vae(self, latents_BCHW: torch.Tensor) -> torch.Tensor:
        """`latents_from_vae`'s inverse: x std + bn mean, unpatchify (the pipeline's tail before `vae.decode`)."""
        mean, std = self._bn_stats()
        return self.pipeline._unpatchify_latents(latents_BCHW.to(self.device, torch.float32) * std + mean)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int | None = None):
        """The loop's latents [B, 4c, h, w] -> PIL images."""
        pipe, images = self.pipeline, []
        chunk = self.decode_batch(chunk)
        for start in range(0, latents.shape[0], chunk):
            raw = self.latents_to_vae(latents[start : start + chunk]).to(pipe.vae.dtype)
            images += pipe.image_processor.postprocess(pipe.vae.decode(raw, return_dict=False)[0], output_type="pil")
        return images

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] -> the loop's latents, from the posterior mode (as the pipeline encodes
        reference images). `encode_images` (PIL, the pipeline's image processor) and precache go through here."""
        vae = self.pipeline.vae
        return self.latents_from_vae(vae.encode(pixels.to(self.device, vae.dtype)).latent_dist.mode())
