"""Wan 2.1 text-to-video (`WanPipeline`): a 3-D DiT (`WanTransformer3DModel`, patch (1, 2, 2)) predicting the flow
velocity over video latents [B, C, F, h, w], umT5 token embeddings (zero-padded to 512 tokens, as the pipeline pads
them, no mask), classifier-free guidance with a negative prompt, and the causal video VAE (`AutoencoderKLWan`: 8x
spatial, 4x temporal, so F = (num_frames - 1) / 4 + 1 latent frames) with per-channel latent statistics.

Rollouts sample with Flow-GRPO's SDE (`flow_sde_step`) along the folder's scheduler sigmas (FlowMatchEuler, or the
published UniPC's flow sigmas: the rollout steps them with the recipe's sampler and `ode_solver`, not UniPC's own
predictor-corrector); the timestep fed to the transformer is 1000 sigma. The Euler step and the SDE are elementwise
and log-probs are means over every non-batch element, so the video axis changes neither. Outputs are `Video`s
(frames as PIL images, `sampling.fps`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.data.noise import Generators, per_sample, randn
from unirl_core.data.video import Video
from unirl_core.domains.diffusion.rollout.samplers import StepResult
from unirl_core.models.family import Family, merged_state

# Wan's text length: the pipeline pads umT5's embeddings to 512 tokens (WanPipeline.__call__'s default)
MAX_SEQUENCE_LENGTH = 512


class WanFamily(Family):
    name, pipeline_class, denoiser_name = "wan", "WanPipeline", "transformer"
    latent_stride = 16  # VAE 8 x patch 2
    temporal_stride = 4  # pixel frames per latent frame after the first: (num_frames - 1) % 4 == 0
    outputs = "video"
    condition_mode = "none"  # text-to-video: image-to-video is Wan's I2V pipeline, another family
    text_only_skip = ("transformer", "vae")
    fps = 16.0  # Wan's native frame rate; `build_family` sets `sampling.fps`
    num_frames = 81  # `build_family` sets `sampling.num_frames` (image-to-video conditions are built at it)

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.wan.tiny import build_wan

        return build_wan()

    def blocks(self) -> list[torch.nn.Module]:
        """The transformer blocks (of every trained expert: Wan 2.2's `trainable` is a ModuleDict of them)."""
        modules = self.trainable.values() if isinstance(self.trainable, torch.nn.ModuleDict) else [self.trainable]
        return [block for module in modules for block in module.blocks]

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        """umT5's embeddings, each prompt's tokens then zeros to 512 (`WanPipeline._get_t5_prompt_embeds`, called
        for every Wan pipeline: the image-to-video module's copy calls ftfy even where it is not installed)."""
        from diffusers import WanPipeline

        embeds = WanPipeline._get_t5_prompt_embeds(
            self.pipeline, prompt=texts, max_sequence_length=MAX_SEQUENCE_LENGTH, device=self.text_device
        )
        return {"embeds": embeds}

    # --- latents ------------------------------------------------------------------------------------------------

    def sample_shape(self, sampling) -> tuple[int, ...]:
        """[C, F, h, w] of one video of `sampling.num_frames` frames at `sampling.height` x `sampling.width`."""
        frames = sampling.num_frames or 1
        factor = self.pipeline.vae_scale_factor_spatial
        latent_frames = (frames - 1) // self.pipeline.vae_scale_factor_temporal + 1
        return self.pipeline.vae.config.z_dim, latent_frames, sampling.height // factor, sampling.width // factor

    # --- scheduler and sampler ----------------------------------------------------------------------------------

    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list[float]:
        """The folder scheduler's sigmas for `num_steps` (num_steps + 1 values, ending at 0)."""
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(num_steps, device="cpu")
        sigmas = [float(s) for s in scheduler.sigmas]
        if len(sigmas) != num_steps + 1 or sigmas[-1] != 0.0:
            raise ValueError(f"{type(scheduler).__name__} gave sigmas {sigmas[:3]}...{sigmas[-1:]} for {num_steps} "
                             "steps: expected num_steps + 1 flow sigmas ending at 0 (use_flow_sigmas)")  # fmt: skip
        return sigmas

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """(1 - s) x0 + s noise at sigma s = schedule[index]."""
        sigma = schedule[index]
        return (1 - sigma) * clean + sigma * noise

    def velocity(self, x: torch.Tensor, sigma_B: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The transformer's output on x [B, C, F, h, w] at per-sample sigmas [B] (timestep 1000 sigma)."""
        return self.trainable(
            hidden_states=x.to(self.dtype), timestep=sigma_B * 1000.0,
            encoder_hidden_states=embeds.to(self.device, self.dtype), return_dict=False,
        )[0]  # fmt: skip

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        inputs = torch.cat([x, x]) if self.cfg else x
        sigma_B = torch.full((inputs.shape[0],), schedule[index], dtype=torch.float32, device=self.device)
        velocity = self.velocity(inputs, sigma_B, cond["embeds"])
        return self.flow_step(
            self.guided(velocity, sampling), x, index, eta, schedule, prev_sample=prev_sample,
            generator=generator, sampling=sampling,
        )  # fmt: skip

    # --- VAE ----------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int | None = None) -> list[Video]:
        """Normalized latents [B, C, F, h, w] -> `Video`s: z = x / (1 / std) + mean (the pipeline's arithmetic),
        decoded `decode_batch(chunk)` videos per VAE call (the VAE itself decodes frame by frame)."""
        vae, videos, chunk = self.pipeline.vae, [], self.decode_batch(chunk)
        mean, std = self.latent_stats(vae.dtype)
        for start in range(0, latents.shape[0], chunk):
            part = latents[start : start + chunk].to(self.device, vae.dtype) / (1.0 / std) + mean
            decoded = vae.decode(part, return_dict=False)[0]
            frames = self.pipeline.video_processor.postprocess_video(decoded, output_type="pil")
            videos += [Video(tuple(video), fps=float(self.fps)) for video in frames]
        return videos

    @torch.no_grad()
    def encode_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels [B, 3, F, H, W] (or [B, 3, H, W]: one frame) in [-1, 1] -> normalized latents float32:
        (posterior mean - latents_mean) / latents_std."""
        vae = self.pipeline.vae
        mean, std = self.latent_stats(vae.dtype)
        video = pixels if pixels.ndim == 5 else pixels[:, :, None]
        return ((vae.encode(video.to(self.device, vae.dtype)).latent_dist.mean - mean) / std).float()

    @torch.no_grad()
    def encode_images(self, images) -> torch.Tensor:
        """PIL images -> one-frame latents [B, C, 1, h, w] (image-to-video conditions, precache)."""
        return self.encode_pixels(self.pipeline.video_processor.preprocess(images))

    # --- warm-up ------------------------------------------------------------------------------------------------

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """Rectified flow with shifted logit-normal sigmas, as SD3's (`SD3Family.denoising_loss`) with the
        scheduler's shift. Per sample, from `generator` (in this order): u = sigmoid(n), n ~ N(0, 1),
        sigma = shift u / (1 + (shift - 1) u), then noise ~ N(0, I); x = (1 - sigma) x0 + sigma noise,
        loss = mean (v - (noise - x0))^2, float32."""
        x0 = clean_latents.to(self.device, torch.float32)
        u = torch.sigmoid(per_sample(generator, x0.shape[0], lambda g, n: randn((n,), g))).to(self.device)
        config = self.pipeline.scheduler.config
        shift = config.get("shift") or config.get("flow_shift") or 1.0
        sigma_B = shift * u / (1 + (shift - 1) * u)
        noise = per_sample(generator, x0.shape[0], lambda g, n: randn((n, *x0.shape[1:]), g)).to(self.device)
        sigma = sigma_B.view(-1, *([1] * (x0.ndim - 1)))
        velocity = self.velocity((1 - sigma) * x0 + sigma * noise, sigma_B, cond["embeds"])
        return flow_matching_loss(velocity, noise, x0)


class WanI2VFamily(WanFamily):
    """Wan 2.1 image-to-video (`WanImageToVideoPipeline`): the prompt's condition image (`media_refs` role
    "condition", one per prompt) enters twice, as the stock pipeline does: its CLIP vision features (the
    penultimate hidden states) as `encoder_hidden_states_image`, and the VAE latents of [image, then black frames]
    with a first-frame mask as 20 extra input channels (the transformer takes 36: the 16 noisy ones, 4 of mask, 16
    of condition). Both CFG branches see the image. The rollout denoises from noise (`condition_mode` "reference");
    the condition is built at the family's `num_frames` (set from `sampling.num_frames`)."""

    name, pipeline_class = "wan_i2v", "WanImageToVideoPipeline"
    condition_mode = "reference"
    text_only_skip = ("transformer", "vae", "image_encoder")

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.wan.tiny import build_wan_i2v

        return build_wan_i2v()

    @torch.no_grad()
    def encode_images(self, images) -> torch.Tensor:
        """PIL condition images -> [B, 4 + C, F, h, w]: the first-frame mask (4 per latent frame: the first
        latent frame's pixel frames) and the normalized VAE latents of each image followed by `num_frames - 1`
        black frames (the stock `prepare_latents`, float32)."""
        pipe, vae = self.pipeline, self.pipeline.vae
        width, height = images[0].size
        image = pipe.video_processor.preprocess(images, height=height, width=width).to(self.device, torch.float32)
        frames = torch.zeros(image.shape[0], 3, self.num_frames - 1, height, width, device=self.device)
        video = torch.cat([image[:, :, None], frames], dim=2).to(vae.dtype)
        mean, std = self.latent_stats(torch.float32)
        latents = (vae.encode(video).latent_dist.mode().float() - mean) / std
        stride = pipe.vae_scale_factor_temporal
        mask = torch.zeros(image.shape[0], stride, latents.shape[2], *latents.shape[-2:], device=self.device)
        mask[:, :, 0] = 1.0  # the first latent frame holds the given image (all `stride` of its mask channels)
        return torch.cat([mask, latents], dim=1)

    @torch.no_grad()
    def image_features(self, images) -> torch.Tensor:
        """CLIP vision features of the condition images: the penultimate hidden states (`encode_image`)."""
        encoder = self.pipeline.image_encoder
        inputs = self.pipeline.image_processor(images=images, return_tensors="pt").to(self.device)
        return encoder(**inputs, output_hidden_states=True).hidden_states[-2].float()

    def with_condition_images(self, cond, prompts: list[str], images: list, latents: torch.Tensor):
        extra = {"condition": latents.to(self.device, torch.float32)}
        if self.trainable.config.image_dim is not None:  # Wan 2.1 I2V reads CLIP features; Wan 2.2's does not
            extra["image_embeds"] = self.image_features(images)
        twice = {k: torch.cat([v, v]) for k, v in extra.items()} if self.cfg else extra
        return {**cond, **twice}

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        if "condition" not in cond:
            raise ValueError(f"{self.name} generates from a condition image: give every prompt one in `media_refs` "
                             "({modality: image, role: condition, uri: ...})")  # fmt: skip
        inputs = torch.cat([x, x]) if self.cfg else x
        sigma_B = torch.full((inputs.shape[0],), schedule[index], dtype=torch.float32, device=self.device)
        image = cond.get("image_embeds")
        velocity = self.trainable(
            hidden_states=torch.cat([inputs, cond["condition"]], dim=1).to(self.dtype), timestep=sigma_B * 1000.0,
            encoder_hidden_states=cond["embeds"].to(self.device, self.dtype),
            encoder_hidden_states_image=None if image is None else image.to(self.dtype), return_dict=False,
        )[0]  # fmt: skip
        return self.flow_step(
            self.guided(velocity, sampling), x, index, eta, schedule, prev_sample=prev_sample,
            generator=generator, sampling=sampling,
        )  # fmt: skip

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        raise ValueError(f"{self.name} has no supervised warm-up yet (it needs each clip's first frame as its "
                         "condition): set train.warmup.steps: 0")  # fmt: skip


class Wan22Family(WanFamily):
    """Wan 2.2 A14B text-to-video (`WanPipeline` with `transformer_2` and `boundary_ratio`): two experts of the same
    architecture, `transformer` for the high-noise steps (timestep >= boundary_ratio x 1000) and `transformer_2`
    for the rest, exactly where the stock pipeline switches; the rollout's and the train stack's log-probs both
    come from the expert of their step. `train.model.experts` names the experts that train (LoRA or full; empty:
    both); the trained ones form `trainable` (a ModuleDict by component name), so FSDP shards, checkpoints and the
    optimizer see them as one module. Both experts guide with `sampling.guidance_scale` (the pipeline's default
    when `guidance_scale_2` is not given). Exports: the first expert's LoRA in the folder, the second's in
    `<folder>/transformer_2/` (diffusers: `pipe.load_lora_weights(folder)`, then
    `pipe.load_lora_weights(folder + "/transformer_2", load_into_transformer_2=True)`)."""

    name = "wan2_2"
    expert_names = ("transformer", "transformer_2")
    text_only_skip = ("transformer", "transformer_2", "vae")

    def __init__(self, path: str, *args, experts: list[str] | None = None, **kwargs):
        self.trained_experts = tuple(experts or self.expert_names)
        super().__init__(path, *args, **kwargs)

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.wan.tiny import build_wan2_2

        return build_wan2_2()

    def trained_module(self, lora) -> torch.nn.Module:
        from unirl_core.models.family import with_adapter

        return torch.nn.ModuleDict({n: with_adapter(getattr(self.pipeline, n), lora) for n in self.trained_experts})

    @contextlib.contextmanager
    def reference(self):
        if not self.has_lora:
            raise ValueError("a KL term (beta > 0) with full fine-tuning needs a frozen reference copy: use LoRA")
        for expert in self.trainable.values():
            expert.disable_adapters()
        try:
            yield
        finally:
            for expert in self.trainable.values():
                expert.enable_adapters()

    def expert(self, sigma: float) -> torch.nn.Module:
        """The expert of noise level `sigma`: the high-noise one from the boundary up (the stock comparison
        `t >= boundary_ratio x num_train_timesteps`)."""
        boundary = self.pipeline.config.boundary_ratio * self.pipeline.scheduler.config.num_train_timesteps
        return self.pipeline.transformer if sigma * 1000.0 >= boundary else self.pipeline.transformer_2

    def trains_step(self, index: int, schedule) -> bool:
        """Whether denoising step `index` runs a trained expert (the rollout trains no frozen expert's step)."""
        return any(self.expert(schedule[index]) is expert for expert in self.trainable.values())

    def velocity(self, x: torch.Tensor, sigma_B: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Each sample through the expert of its sigma (a batch of one noise level: one call)."""
        experts = [self.expert(float(s)) for s in sigma_B]
        output = None
        for module in dict.fromkeys(experts):
            rows = torch.tensor([e is module for e in experts], device=x.device)
            part = module(
                hidden_states=x[rows].to(self.dtype),
                timestep=sigma_B[rows] * 1000.0,
                encoder_hidden_states=embeds[rows].to(self.device, self.dtype),
                return_dict=False,
            )[0]
            output = part.new_zeros((x.shape[0], *part.shape[1:])) if output is None else output
            output[rows] = part
        return output

    def export_adapter(self, folder: Path, base_path: str) -> None:
        for name, expert in self.trainable.items():
            target = folder if name == "transformer" else folder / name
            target.mkdir(parents=True, exist_ok=True)
            self.export_module_adapter(expert, target, base_path, name)

    def export_merged(self, folder: Path, base_path: str) -> None:
        base = type(self)(base_path, dtype=str(self.dtype).removeprefix("torch."), lora=None)
        for name, expert in self.trainable.items():
            getattr(base.pipeline, name).load_state_dict(merged_state(expert, self.has_lora), strict=True)
        base.pipeline.save_pretrained(str(folder))


class WanTI2VFamily(WanFamily):
    """Wan 2.2 TI2V-5B, text-to-video (`WanPipeline` with `expand_timesteps`): one 5 B transformer of 48 channels
    over the high-compression VAE (z_dim 48, 16x spatial with its 2x2 patchify, 4x temporal), each latent token
    fed its own timestep (all equal without a condition image, as the stock pipeline's all-ones mask gives). Its
    image-to-video mode (the condition image's latents as the first latent frame, at timestep 0) is not trained
    here yet: a prompt with a condition image is refused, naming it."""

    name = "wan_ti2v"
    latent_stride = 32  # VAE 16 x patch 2

    @classmethod
    def build_tiny(cls):
        from unirl_core.models.families.wan.tiny import build_wan_ti2v

        return build_wan_ti2v()

    def velocity(self, x: torch.Tensor, sigma_B: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The transformer's output with a timestep per latent token ([B, F x h/2 x w/2], the stock pipeline's
        `expand_timesteps` form)."""
        _, _, frames, height, width = x.shape
        patch = self.trainable.config.patch_size
        tokens = (frames // patch[0]) * (height // patch[1]) * (width // patch[2])
        return self.trainable(
            hidden_states=x.to(self.dtype), timestep=(sigma_B * 1000.0)[:, None].expand(-1, tokens),
            encoder_hidden_states=embeds.to(self.device, self.dtype), return_dict=False,
        )[0]  # fmt: skip
