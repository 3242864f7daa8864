"""Qwen-Image (`QwenImagePipeline`) and Qwen-Image-Edit (`QwenImageEditPipeline`): an MMDiT over 2x2-packed latents
predicting the flow-matching velocity, Qwen2.5-VL's last hidden states as the text conditioning (with a padding mask),
a 3D (video) VAE normalized per channel, sampled with Flow-GRPO's SDE (`flow_sde_step`) on the pipeline's
dynamically shifted sigmas, and true CFG with the pipeline's norm-preserving rescale.

| piece          | what the stock pipeline does                            | here                                         |
|----------------|---------------------------------------------------------|----------------------------------------------|
| latents        | packed [B, (h/2)(w/2), 4C]                              | unpacked [B, C, h, w] in the loop, packed in |
|                |                                                         | `transition` / `denoising_loss`              |
| text           | padded to the longest prompt of the call, with a mask   | each prompt alone, padded (embeds and mask)  |
|                |                                                         | to `max_sequence_length`; a batch is trimmed |
|                |                                                         | to its longest prompt before the transformer |
| schedule       | sigmas linspace(1, 1/n, n), shifted by mu(image tokens) | the same, read from the scheduler            |
| CFG            | neg + s (cond - neg), rescaled to the cond's norm per   | `guided` (on packed tokens: the same norm)   |
|                | token                                                   |                                              |
| VAE            | z = (mean - latents_mean) / latents_std, frame axis 1   | `encode_images` / `decode` do the same       |

Padding is exact: the transformer masks padded text keys in its joint attention and places text RoPE by absolute
position, so image tokens do not see the padding (tested against the stock pipeline).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.families.flux.family import pack, unpack  # the same 2x2 packing (`_pack_latents`)
from unirl_core.models.family import Family

# Qwen/Qwen-Image's transformer/config.json: diffusers' QwenImageTransformer2DModel defaults are that config
# (60 dual-stream blocks, 24 heads x 128, text width 3584 = Qwen2.5-VL-7B, RoPE axes 16/56/56); Qwen-Image-Edit
# shares the architecture (its image conditioning is extra sequence tokens, not extra channels).
QWEN_IMAGE_TRANSFORMER = {
    "patch_size": 2, "in_channels": 64, "out_channels": 16, "num_layers": 60, "attention_head_dim": 128,
    "num_attention_heads": 24, "joint_attention_dim": 3584, "guidance_embeds": False, "axes_dims_rope": [16, 56, 56],
}  # fmt: skip


def true_cfg(negative: torch.Tensor, positive: torch.Tensor, scale: float) -> torch.Tensor:
    """Qwen-Image's guidance on the negative and positive packed float32 outputs [B, N, D]:
    g = neg + s (pos - neg), then g |pos| / |g| with norms over each token's D (the pipeline's rescale)."""
    combined = negative + scale * (positive - negative)
    return combined * (torch.norm(positive, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))


class QwenImageFamily(Family):
    name, pipeline_class, denoiser_name = "qwen_image", "QwenImagePipeline", "transformer"
    latent_stride = 16  # VAE 8 x patch 2
    text_only_skip = ("transformer", "vae")
    guidance = "true CFG, norm-rescaled"  # `sampling.guidance_scale` is the pipeline's true_cfg_scale
    # text tokens kept per prompt (after the template's dropped prefix) and the fixed padded length of the cached
    # conditioning: the pipeline's `max_sequence_length` default
    max_sequence_length: ClassVar[int] = 512
    # flow_grpo's Qwen-Image LoRA (scripts/train_qwenimage_edit_plus.py: r 64, alpha 128, these modules)
    lora_targets: ClassVar[tuple[str, ...]] = (
        "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj", "attn.add_k_proj",
        "attn.add_v_proj", "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj",
        "txt_mlp.net.2",
    )  # fmt: skip
    denoiser_configs: ClassVar[dict[str, dict]] = {"qwen-image": QWEN_IMAGE_TRANSFORMER}

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.qwen_image.tiny import build_qwen_image

        return build_qwen_image()

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.trainable.transformer_blocks)

    # --- text conditioning --------------------------------------------------------------------------------------

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        """{"embeds": [B, L, D], "mask": [B, L] int64}, L = `max_sequence_length`: each text encoded alone (as the
        pipeline encodes one prompt), then zero-padded with mask 0."""
        embeds = []
        for text in texts:
            embed, _ = self.pipeline.encode_prompt(
                prompt=[text], device=self.text_device, max_sequence_length=self.max_sequence_length
            )
            embeds.append(embed[0])
        return self._padded(embeds)

    def _padded(self, embeds: list[torch.Tensor], length: int | None = None) -> dict:
        """Per-text embeddings [T_i, D] -> {"embeds": [B, L, D], "mask": [B, L]} zero-padded to L (default
        `max_sequence_length`)."""
        length = length or self.max_sequence_length
        if max(e.shape[0] for e in embeds) > length:
            raise ValueError(f"a text encodes to more than {length} tokens: raise max_sequence_length")
        mask = torch.zeros((len(embeds), length), dtype=torch.long, device=self.device)
        padded = embeds[0].new_zeros((len(embeds), length, embeds[0].shape[-1]))
        for i, embed in enumerate(embeds):
            padded[i, : embed.shape[0]], mask[i, : embed.shape[0]] = embed, 1
        return {"embeds": padded, "mask": mask}

    def text_identity(self) -> dict:
        return {**super().text_identity(), "max_sequence_length": self.max_sequence_length}

    def pack_conditioning(self, cond: dict) -> torch.Tensor:
        """embeds [B, L, D] and mask [B, L] -> [B, L + ceil(L / D), D]: the embeds, then the mask (0/1, exact in any
        dtype) laid out row by row and zero-filled."""
        embeds, mask = cond["embeds"], cond["mask"]
        rows = math.ceil(mask.shape[-1] / embeds.shape[-1])
        flat = torch.nn.functional.pad(mask.to(embeds.dtype), (0, rows * embeds.shape[-1] - mask.shape[-1]))
        return torch.cat([embeds, flat.view(*mask.shape[:-1], rows, embeds.shape[-1])], dim=-2)

    @classmethod
    def unpack_conditioning(cls, packed: torch.Tensor, path: str) -> dict:
        length = cls.max_sequence_length
        mask = packed[..., length:, :].flatten(-2)[..., :length]
        return {"embeds": packed[..., :length, :], "mask": mask.round().long()}

    def _text(self, cond: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch's embeds and mask trimmed to its longest text (padding beyond it is masked anyway); mask None
        when nothing is padded (as the pipeline passes it)."""
        if "mask" not in cond:
            raise ValueError(f"{self.name}: no text conditioning (edit models need a condition image per prompt)")
        mask = cond["mask"].to(self.device)
        length = int(mask.sum(dim=1).max())
        mask = mask[:, :length]
        embeds = cond["embeds"][:, :length].to(self.device, self.dtype)
        return embeds, (None if bool(mask.all()) else mask)

    # --- latents ------------------------------------------------------------------------------------------------

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        factor = self.pipeline.vae_scale_factor
        return self.pipeline.vae.config.z_dim, height // factor, width // factor

    # --- scheduler and sampler ----------------------------------------------------------------------------------

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[float]:
        """The pipeline's sigmas: linspace(1, 1/n, n) shifted by mu = calculate_shift(image tokens) (and the
        scheduler's terminal stretch), then 0."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

        _, h, w = latent_shape
        config = self.pipeline.scheduler.config
        mu = calculate_shift(
            (h // 2) * (w // 2), config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5), config.get("max_shift", 1.15),
        )  # fmt: skip
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        self.pipeline.scheduler.set_timesteps(sigmas=sigmas, mu=mu, device="cpu")
        return [float(s) for s in self.pipeline.scheduler.sigmas]

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """(1 - s) x0 + s noise at sigma s = schedule[index]."""
        sigma = schedule[index]
        return (1 - sigma) * clean + sigma * noise

    def velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: dict) -> torch.Tensor:
        """The transformer's packed output [B, N, 4C] on x [B, C, h, w] at per-sample sigmas [B] (float32), the
        timestep fed as the pipeline feeds it: (1000 sigma in the model dtype) / 1000. With `cond["reference"]`
        (edit models), the reference's packed tokens follow the noisy ones and the output is cut to the latter."""
        _, _, h, w = x.shape
        tokens = pack(x.to(self.dtype))
        shapes = [(1, h // 2, w // 2)]
        if "reference" in cond:
            reference = cond["reference"].to(self.device, self.dtype)
            tokens = torch.cat([tokens, pack(reference)], dim=1)
            shapes.append((1, reference.shape[-2] // 2, reference.shape[-1] // 2))
        embeds, mask = self._text(cond)
        output = self.trainable(
            hidden_states=tokens, timestep=(sigma.float() * 1000).to(self.dtype) / 1000, encoder_hidden_states=embeds,
            encoder_hidden_states_mask=mask, img_shapes=[shapes] * x.shape[0], return_dict=False,
        )[0]  # fmt: skip
        return output[:, : (h // 2) * (w // 2)]

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        sigma = schedule[index]
        inputs = torch.cat([x, x]) if self.cfg else x
        sigma_B = torch.full((inputs.shape[0],), sigma, dtype=torch.float32, device=self.device)
        velocity = unpack(self.guided(self.velocity(inputs, sigma_B, cond), sampling), *x.shape[-2:])
        return self.flow_step(velocity, x, index, eta, schedule, prev_sample=prev_sample, generator=generator,
                              sampling=sampling)  # fmt: skip

    # --- classifier-free guidance -------------------------------------------------------------------------------

    def guided(self, output: torch.Tensor, sampling=None) -> torch.Tensor:
        """Packed outputs [(2)B, N, 4C] -> float32: true CFG with the norm rescale (`true_cfg`)."""
        return true_cfg(*self.cfg_halves(output, sampling), self.guidance_scale) if self.cfg else output.float()

    # --- VAE ----------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int | None = None):
        """Scaled latents [B, C, h, w] -> PIL images: z = x / (1 / std) + mean (the pipeline's arithmetic), decoded
        as one-frame videos."""
        vae, images, chunk = self.pipeline.vae, [], self.decode_batch(chunk)
        mean, std = self.latent_stats(vae.dtype)
        for start in range(0, latents.shape[0], chunk):
            part = latents[start : start + chunk, :, None].to(self.device, vae.dtype) / (1.0 / std) + mean
            decoded = vae.decode(part, return_dict=False)[0][:, :, 0]
            images += self.pipeline.image_processor.postprocess(decoded, output_type="pil")
        return images

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, H, W] in [-1, 1] -> scaled latents [B, C, h, w] float32: (posterior mean - latents_mean) /
        latents_std, encoded as one-frame videos (the edit pipeline's `_encode_vae_image`). `encode_images` (PIL)
        and the precache's `PipelineImageEncoder` both come here."""
        vae = self.pipeline.vae
        mean, std = self.latent_stats(vae.dtype)
        latents = (vae.encode(pixels.to(self.device, vae.dtype)[:, :, None]).latent_dist.mode() - mean) / std
        return latents[:, :, 0].float()

    # --- warm-up ------------------------------------------------------------------------------------------------

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """Rectified flow with logit-normal sigmas (diffusers' train_dreambooth_lora_qwen_image.py with
        `--weighting_scheme logit_normal`; no resolution shift). Per sample, from `generator` (in this order):
        sigma = sigmoid(n), n ~ N(0, 1), then noise ~ N(0, I); x = (1 - sigma) x0 + sigma noise,
        loss = mean (v - (noise - x0))^2, unweighted, float32."""
        x0 = clean_latents.to(self.device, torch.float32)
        sigma_B = torch.sigmoid(per_sample(generator, x0.shape[0], lambda g, n: randn((n,), g))).to(self.device)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        sigma_B111 = sigma_B.view(-1, 1, 1, 1)
        x = (1 - sigma_B111) * x0 + sigma_B111 * noise
        velocity = unpack(self.velocity(x, sigma_B, cond).float(), *x0.shape[-2:])
        return flow_matching_loss(velocity, noise, x0)


class QwenImageEditFamily(QwenImageFamily):
    """Qwen-Image-Edit: the condition image enters twice, as the stock pipeline does: Qwen2.5-VL reads it with the
    instruction (the edit template; prompts are re-encoded with their images, no text cache), and its VAE latents
    ride along as `cond["reference"]`, packed after the noisy tokens (a second `img_shapes` entry) with the output
    cut to the noisy tokens.

    The condition is used at the size the rollout loads it (`sampling.width` x `sampling.height`), as Flow-GRPO's
    Qwen-Image-Edit trainer does (scripts/train_qwenimage_edit_plus.py resizes condition images to the training
    resolution and takes their `img_shapes` from `calculate_dimensions(512 * 512, 1)`); the stock pipeline instead
    resizes it to a ~1024^2 area (`calculate_dimensions(1024 * 1024, ratio)`), so the two agree when the rollout's
    size is that area's. Text-only conditioning does not exist for this family (`encode` is empty until the images
    come)."""

    name, pipeline_class = "qwen_image_edit", "QwenImageEditPipeline"
    condition_mode = "reference"
    text_only_conditioning = False  # the edit template reads each prompt with its image
    denoiser_configs: ClassVar[dict[str, dict]] = {"qwen-image-edit": QWEN_IMAGE_TRANSFORMER}

    def __init__(self, path: str, *args, **kwargs):
        import unirl_core.models.families.qwen_image.tiny  # noqa: F401  (the tiny folder's processor class, see there)

        super().__init__(path, *args, **kwargs)

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.qwen_image.tiny import build_qwen_image_edit

        return build_qwen_image_edit()

    def encode(self, prompts: list[str]) -> dict:
        """Nothing without the images: the edit template reads each prompt with its condition image, so the whole
        conditioning is built in `with_condition_images`."""
        return {}

    def encode_texts(self, texts: list[str]) -> dict:
        raise ValueError(
            "qwen_image_edit encodes a prompt together with its condition image: give every prompt an image "
            "(media_refs role 'condition'); text-only conditioning (precache, warm-up) is not available"
        )

    @torch.no_grad()
    def with_condition_images(self, cond, prompts: list[str], images: list, latents: torch.Tensor):
        """{"embeds", "mask"} of each (prompt, image) through the edit template (the negative prompt with the same
        image first under CFG), padded to the batch's longest (the edit pipeline keeps every token), and
        "reference": the images' latents [B, C, h, w] (both CFG halves)."""
        texts = [*([self.negative_prompt] * len(prompts)), *prompts] if self.cfg else list(prompts)
        pictures = [*images, *images] if self.cfg else list(images)
        embeds = [
            self.pipeline.encode_prompt(prompt=[text], image=[picture], device=self.text_device)[0][0]
            for text, picture in zip(texts, pictures, strict=True)
        ]
        reference = latents.to(self.device, torch.float32)
        padded = {k: v.to(self.device) for k, v in self._padded(embeds, max(e.shape[0] for e in embeds)).items()}
        return {**padded, "reference": torch.cat([reference, reference]) if self.cfg else reference}
