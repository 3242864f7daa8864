"""Model-family adapters: everything family-specific behind one small contract, so one rollout loop and one train
stack serve every family (Flow-GRPO copies a trainer per model; we do not).

    adapter.encode(prompts)                         -> conditioning (with the negative prompt when CFG is on)
    adapter.initial_noise(sample_ids, seed, shape)  -> float32 latents, bit-identical for a (seed, sample id)
    adapter.transition(x, i, eta, cond, prev=None)  -> StepResult of denoising step i (log-prob when stochastic)
    adapter.decode(latents)                          -> PIL images (VAE decode in chunks)
    adapter.encode_images(images), adapter.noised()  -> image-to-image starts from a condition image
    adapter.trainable / adapter.reference()          -> the trained module; a context with the adapter disabled
    adapter.denoising_loss(x0, cond, generator)      -> the supervised (warm-up) loss on clean latents

Adding a family (Flux, Qwen-Image, Wan) = one adapter class here (or in its own file) registered in FAMILIES,
plus a recipe with `train.model.family` set to it.
"""

from __future__ import annotations

import contextlib
import hashlib

import torch

from unirl_core.algorithms.losses import flow_matching_loss
from unirl_core.rollout.noise import Generators, per_sample, randn, sample_seed
from unirl_core.rollout.samplers import StepResult, ddim_step, flow_sde_step

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_model_path(path: str) -> str:
    """`tiny:<family>` -> a tiny pipeline folder in the workspace (built once); anything else is used as is."""
    if not path.startswith("tiny:"):
        return path
    from unirl_core.models.tiny import write_tiny_model
    from unirl_core.workspace import workspace

    family = path.split(":", 1)[1]
    folder = workspace().root / "models" / f"tiny-{family}-seed0"
    if not (folder / "model_index.json").exists():
        write_tiny_model(folder, family, seed=0)
    return str(folder)


class _Adapter:
    pipeline_class = ""
    denoiser_name = ""

    def __init__(
        self,
        path: str,
        device: str = "cpu",
        dtype: str = "float32",
        lora=None,
        guidance_scale: float = 4.5,
        negative_prompt: str = "",
    ):
        import diffusers

        pipeline = getattr(diffusers, self.pipeline_class).from_pretrained(
            resolve_model_path(path), dtype=DTYPES[dtype]
        )
        self.pipeline = pipeline.to(device)
        self.pipeline.set_progress_bar_config(disable=True)
        self.device, self.dtype = torch.device(device), DTYPES[dtype]
        self.guidance_scale, self.negative_prompt = guidance_scale, negative_prompt
        self.trainable = getattr(pipeline, self.denoiser_name)
        for module in pipeline.components.values():
            if isinstance(module, torch.nn.Module):
                module.requires_grad_(False)
        self.text_cache, self.text_cache_hits, self.text_cache_misses = None, 0, 0
        self.has_lora = lora is not None
        if lora is not None:
            from peft import LoraConfig

            config = LoraConfig(
                r=lora.rank,
                lora_alpha=lora.alpha,
                target_modules=list(lora.target_modules),
                init_lora_weights="gaussian",
            )
            self.trainable.add_adapter(config)
        else:
            self.trainable.requires_grad_(True)

    def attach_text_cache(self, root: str) -> None:
        """Read prompt conditioning through the text-embedding cache at `root` (misses are computed and written)."""
        from unirl_core.precache.prompt_cache import PromptEmbeddingCache

        self.text_cache = PromptEmbeddingCache(root, self.text_identity())

    def text_identity(self) -> dict:
        """What the conditioning depends on: the family and a fingerprint of every text encoder's weights."""
        digest = hashlib.sha256()
        for name, module in sorted(self.pipeline.components.items()):
            if name.startswith("text_encoder") and isinstance(module, torch.nn.Module):
                for key, tensor in sorted(module.state_dict().items()):
                    digest.update(f"{name}.{key}".encode())
                    digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return {"adapter": type(self).__name__, "text_encoders": digest.hexdigest()[:16], "dtype": str(self.dtype)}

    @torch.no_grad()
    def embed_texts(self, texts: list[str]) -> dict[str, dict[str, torch.Tensor]]:
        """Each distinct text's conditioning (unbatched tensors), through the cache when one is attached."""
        distinct = list(dict.fromkeys(texts))
        found = {t: self.text_cache.get(t) for t in distinct} if self.text_cache else {t: None for t in distinct}
        missing = [t for t, entry in found.items() if entry is None]
        if missing:
            computed = self.encode_texts(missing)
            for i, text in enumerate(missing):
                found[text] = {k: v[i].detach().cpu().contiguous() for k, v in computed.items()}
                if self.text_cache:
                    self.text_cache.put(text, found[text])
                    self.text_cache_misses += 1
        if self.text_cache:
            self.text_cache_hits += len(distinct) - len(missing)
        return found

    def encode(self, prompts: list[str]) -> dict:
        """Conditioning of a batch (with the negative prompt's first, as [negative, positive], when CFG is on).
        Each distinct text is encoded once."""
        texts = [*prompts, self.negative_prompt] if self.cfg else list(prompts)
        table = self.embed_texts(texts)
        positive = {k: torch.stack([table[p][k] for p in prompts]) for k in table[prompts[0]]}
        if self.cfg:
            negative = table[self.negative_prompt]
            positive = {k: torch.cat([negative[k].expand_as(v), v]) for k, v in positive.items()}
        return {k: v.to(self.device) for k, v in positive.items()}

    @property
    def cfg(self) -> bool:
        return self.guidance_scale > 1.0

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.trainable.parameters() if p.requires_grad]

    def blocks(self) -> list[torch.nn.Module]:
        """The trained module's repeated blocks: the units FSDP shards (and checkpoints activations of)."""
        raise NotImplementedError

    @contextlib.contextmanager
    def reference(self):
        """The reference policy: the adapter disabled (LoRA). Full fine-tuning keeps no frozen copy here."""
        if not self.has_lora:
            raise ValueError("a KL term (beta > 0) with full fine-tuning needs a frozen reference copy: use LoRA")
        self.trainable.disable_adapters()
        try:
            yield
        finally:
            self.trainable.enable_adapters()

    def initial_noise(self, sample_ids: list[str], seed: int, shape: tuple[int, ...]) -> torch.Tensor:
        noises = [torch.randn(shape, generator=torch.Generator().manual_seed(sample_seed(seed, s))) for s in sample_ids]
        return torch.stack(noises).to(self.device)

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        factor = self.pipeline.vae_scale_factor
        return self.trainable.config.in_channels, height // factor, width // factor

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, chunk: int = 8):
        images = []
        vae = self.pipeline.vae
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
        vae = self.pipeline.vae
        pixels = self.pipeline.image_processor.preprocess(images).to(self.device, vae.dtype)
        latents = vae.encode(pixels).latent_dist.mean.float()
        if getattr(vae.config, "shift_factor", None) is not None:
            latents = latents - vae.config.shift_factor
        return latents * vae.config.scaling_factor

    def select(self, cond: dict, index: torch.Tensor) -> dict:
        """The conditioning of a subset of samples (both CFG halves, kept in [negative, positive] order)."""
        if not self.cfg:
            return {k: v[index] for k, v in cond.items()}
        halves = {k: v.chunk(2) for k, v in cond.items()}
        return {k: torch.cat([negative[index], positive[index]]) for k, (negative, positive) in halves.items()}

    def _guided(self, output: torch.Tensor) -> torch.Tensor:
        if not self.cfg:
            return output.float()
        uncond, cond = output.float().chunk(2)
        return uncond + self.guidance_scale * (cond - uncond)


class SD3Adapter(_Adapter):
    """StableDiffusion3Pipeline parts: flow matching, velocity prediction, the Flow-GRPO SDE sampler."""

    pipeline_class, denoiser_name = "StableDiffusion3Pipeline", "transformer"

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.trainable.transformer_blocks)

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        embeds, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=texts, prompt_2=None, prompt_3=None, do_classifier_free_guidance=False, device=self.device
        )
        return {"embeds": embeds, "pooled": pooled}

    def schedule(self, num_steps: int) -> list[float]:
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(num_steps, device="cpu")
        return [float(s) for s in scheduler.sigmas]  # num_steps + 1 values, ending at 0

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """x at step `index` of the schedule from a clean latent (image-to-image start): (1 - s) x0 + s noise."""
        sigma = schedule[index]
        return (1 - sigma) * clean + sigma * noise

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None) -> StepResult:
        sigma, sigma_next = schedule[index], schedule[index + 1]
        inputs = torch.cat([x, x]) if self.cfg else x
        timestep = torch.full((inputs.shape[0],), sigma * 1000.0, device=self.device)
        velocity = self.trainable(
            hidden_states=inputs.to(self.dtype), timestep=timestep, encoder_hidden_states=cond["embeds"],
            pooled_projections=cond["pooled"], return_dict=False,
        )[0]  # fmt: skip
        return flow_sde_step(
            self._guided(velocity),
            x,
            sigma,
            sigma_next,
            eta,
            sigma_max=schedule[1],
            prev_sample=prev_sample,
            generator=generator,
        )

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """SD3's rectified-flow training loss on scaled clean latents x0 [B,C,h,w] and conditioning without a
        negative half (`encode_texts`). Per sample, from `generator` (one, or one per sample; in this order):
        u = sigmoid(n), n ~ N(0, 1) (SD3's logit-normal timestep density), sigma = shift u / (1 + (shift - 1) u)
        (the scheduler's timestep shift, as diffusers' SD3 training samples its shifted sigmas), then
        noise ~ N(0, I); x = (1 - sigma) x0 + sigma noise, loss = mean (v - (noise - x0))^2, unweighted, float32."""
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


class SD15Adapter(_Adapter):
    """StableDiffusionPipeline parts: a UNet predicting epsilon, DDIM with eta (DDPO's sampler)."""

    pipeline_class, denoiser_name = "StableDiffusionPipeline", "unet"

    def blocks(self) -> list[torch.nn.Module]:
        unet = self.trainable
        return [*unet.down_blocks, unet.mid_block, *unet.up_blocks]

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> dict:
        embeds, _ = self.pipeline.encode_prompt(texts, self.device, 1, False)
        return {"embeds": embeds}

    def schedule(self, num_steps: int) -> list[float]:
        scheduler = self.pipeline.scheduler
        scheduler.set_timesteps(num_steps, device="cpu")
        timesteps = [int(t) for t in scheduler.timesteps]
        return timesteps + [-1]

    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """x at step `index` from a clean latent (image-to-image start): sqrt(a_t) x0 + sqrt(1 - a_t) noise."""
        alpha = self.pipeline.scheduler.alphas_cumprod[schedule[index]].item()
        return alpha**0.5 * clean + (1 - alpha) ** 0.5 * noise

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None) -> StepResult:
        scheduler = self.pipeline.scheduler
        t, t_prev = schedule[index], schedule[index + 1]
        alpha = scheduler.alphas_cumprod[t].item()
        alpha_prev = scheduler.alphas_cumprod[t_prev].item() if t_prev >= 0 else scheduler.final_alpha_cumprod.item()
        inputs = torch.cat([x, x]) if self.cfg else x
        timestep = torch.full((inputs.shape[0],), t, device=self.device)
        eps = self.trainable(inputs.to(self.dtype), timestep, encoder_hidden_states=cond["embeds"], return_dict=False)[
            0
        ]
        return ddim_step(self._guided(eps), x, alpha, alpha_prev, eta, prev_sample=prev_sample, generator=generator)

    def denoising_loss(self, clean_latents: torch.Tensor, cond: dict, generator: Generators) -> torch.Tensor:
        """DDPM's epsilon loss on scaled clean latents x0 [B,C,h,w] and conditioning without a negative half. Per
        sample, from `generator` (one, or one per sample; in this order): t uniform in [0, num_train_timesteps),
        then noise ~ N(0, I); x_t = scheduler.add_noise(x0, noise, t), loss = mean (eps - noise)^2, unweighted,
        float32."""
        scheduler = self.pipeline.scheduler
        if scheduler.config.prediction_type != "epsilon":
            raise ValueError(
                f"scheduler prediction_type={scheduler.config.prediction_type!r}: the sd15 adapter samples and "
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

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        factor = self.pipeline.vae_scale_factor
        return self.trainable.config.in_channels, height // factor, width // factor


FAMILIES = {"sd3": SD3Adapter, "sd15": SD15Adapter}


def build_adapter(model_config, sampling_config, device: str = "cpu"):
    cls = FAMILIES[model_config.family]
    adapter = cls(
        model_config.path, device=device, dtype=model_config.dtype, lora=model_config.lora,
        guidance_scale=sampling_config.guidance_scale, negative_prompt=sampling_config.negative_prompt,
    )  # fmt: skip
    if model_config.text_embedding_cache:
        adapter.attach_text_cache(model_config.text_embedding_cache)
    return adapter


__all__ = ["FAMILIES", "SD3Adapter", "SD15Adapter", "build_adapter", "resolve_model_path"]
