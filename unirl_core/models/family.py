"""The model-family contract: everything family-specific behind one typed interface, so one rollout loop, one train
stack, one warm-up, one precache and one export serve every family (Flow-GRPO copies a trainer per model; we do
not). An instance is the model the loop drives (`family` there).

| concern              | members                                                                                   |
|----------------------|-------------------------------------------------------------------------------------------|
| loading              | `__init__(path, ...)` a diffusers folder; `build_tiny(seed)` the tiny test model          |
| trained module, LoRA | `trainable`, `parameters()`, `blocks()` (FSDP units), `reference()` (adapter disabled)    |
| text conditioning    | the `TextConditioning` part (`models/parts/text.py`; `PooledConditioning` its pooled      |
|                      | variant): `encode_texts(texts)`, `encode(prompts)` (CFG halves), `text_identity()` (cache |
|                      | key), `pack_conditioning` / `unpack_conditioning` (the precache form: one tensor per prompt)|
| latents              | `sample_shape(sampling)` (`latent_shape(h, w)` for images), `latent_stride`,              |
|                      | `initial_noise(ids, seed, shape)`; video families: `outputs = "video"`, `temporal_stride`  |
| scheduler, sampler   | `schedule(n, shape)`, `transition(x, i, eta, cond, schedule, ..., sampling)`, `noised`,   |
|                      | `sampler_kind`, `step_sampling(algorithm)` (the sampler and CFG gradient, per call)        |
| condition images     | `condition_mode`: "start" (image-to-image from the noised image) or "reference" (edit     |
|                      | models: `with_condition_images(cond, prompts, images, latents)` adds it to the conditioning)|
| VAE                  | the `VaeCodec` part (`parts/vae.py`): `decode(latents)`, `encode_images(images)`,         |
|                      | `encode_pixels(pixels)` (precache)                                                        |
| CFG                  | the `ClassifierFreeGuidance` part (`parts/guidance.py`): `cfg`, `select(cond, index)`,    |
|                      | `guided(output, sampling)`, `with_guidance(scale)` (a view)                               |
| warm-up target       | `denoising_loss(x0, cond, generators)`                                                    |
| export               | `export_adapter(folder, base)` (peft + diffusers LoRA), `export_merged(folder, base)`     |

Adding a family is one folder in `models/families/` (its `family.py`, `tiny.py`, `real_size.py`; see that package's
docstring); the registry finds it and nothing in the loop changes. The parts (`models/parts/`) are mixed in beside
this base: a family composes another part (a video VAE, embedded guidance) by mixing in its own before `Family`, or
overrides one member. The generic parts assume a diffusers pipeline with a VAE (`vae`, `image_processor`,
`vae_scale_factor`); a family that differs overrides them.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

import torch

from unirl_core.data.noise import Generators, sample_seed
from unirl_core.domains.diffusion.rollout.samplers import Sampler, StepResult, StepSampling
from unirl_core.models.dtypes import DTYPES
from unirl_core.models.parts.guidance import ClassifierFreeGuidance
from unirl_core.models.parts.text import TEXT_ENCODER_PREFIX, PooledConditioning, TextConditioning
from unirl_core.models.parts.vae import VaeCodec
from unirl_core.models.text_cache import CachedConditioning, Conditioning

__all__ = ["Family", "PooledConditioning", "StepSampling", "canonical_header", "sorted_sets"]


class Family(TextConditioning, VaeCodec, ClassifierFreeGuidance, ABC):
    name: ClassVar[str]  # the recipe's `train.model.family`
    pipeline_class: ClassVar[str]  # the diffusers pipeline class that loads the folder
    denoiser_name: ClassVar[str]  # the pipeline component that is trained
    latent_stride: ClassVar[int]  # pixels per latent token (VAE stride x patch size): image sizes are multiples
    text_only_skip: ClassVar[tuple[str, ...]]  # components not loaded for text conditioning alone (precache)
    # how a prompt's condition image (`media_refs` role "condition") enters a rollout: "start" denoises from the
    # noised image (image-to-image, `sampling.condition_strength`); "reference" denoises from noise with the image
    # in the conditioning (edit models: FLUX.1-Kontext, Qwen-Image-Edit), see `with_condition_images`; "none": text
    # only (a prompt with a condition image is refused, naming it)
    condition_mode: ClassVar[str] = "start"
    sampler: ClassVar[str] = "flow SDE"  # how rollouts sample (shown by `unirl families`)
    outputs: ClassVar[str] = "image"  # what `decode` returns and the rewards score: "image" (PIL) or "video" (`Video`)
    temporal_stride: ClassVar[int] = 0  # video families: pixel frames per latent frame, (num_frames - 1) % it == 0
    expert_names: ClassVar[tuple[str, ...]] = ()  # several denoisers (Wan 2.2's experts): `train.model.experts`
    lora_pipeline_class: ClassVar[str | None] = None  # whose `save_lora_weights` writes the diffusers LoRA file
    # (None: `pipeline_class`; a pipeline without a LoRA loader names one of the same format)
    text_only_conditioning: ClassVar[bool] = True  # False: a prompt is encoded with its condition image only (no
    # text-only precache or warm-up; e.g. Qwen-Image-Edit's VLM reads the image with the prompt)

    def __init__(
        self,
        path: str,
        device: str = "cpu",
        dtype: str = "float32",
        lora=None,
        guidance_scale: float = 4.5,
        negative_prompt: str = "",
        text_only: bool = False,
        vae_only: bool = False,
        text_encoders: str = "device",
        vae_decode_batch: int = 8,
        vae_tiling: bool = False,
    ):
        """Load the pipeline folder `path` (already resolved: see `registry.resolve_model_path`), freeze it, add
        the LoRA adapter (or unfreeze the denoiser for full fine-tuning). `text_only`: the text encoders alone;
        `vae_only`: the VAE alone (precache). `text_encoders`: "device" (with the model) or "cpu" (kept on the CPU,
        cache misses encoded there; see `text_encoder_placement`). `vae_decode_batch`: images per VAE decode call;
        `vae_tiling`: the VAE decodes (and encodes) in overlapping tiles (diffusers' `enable_tiling`)."""
        import diffusers

        pipeline_class = getattr(diffusers, self.pipeline_class)
        skipped = {name: None for name in self.text_only_skip} if text_only else {}
        if vae_only:
            components = pipeline_class.load_config(path)
            skipped = {k: None for k, v in components.items() if isinstance(v, list) and k not in ("vae", "scheduler")}
        pipeline = pipeline_class.from_pretrained(path, dtype=DTYPES[dtype], **skipped)
        if text_encoders not in ("device", "cpu"):
            raise ValueError(f"text_encoders {text_encoders!r}: choose device or cpu (resolve auto first)")
        if text_encoders == "cpu" and torch.device(device).type != "cpu":
            for name, module in pipeline.components.items():  # one move each: the text encoders never visit `device`
                if isinstance(module, torch.nn.Module):
                    module.to("cpu" if name.startswith(TEXT_ENCODER_PREFIX) else device)
            self.pipeline = pipeline
        else:
            self.pipeline = pipeline.to(device)
        self.pipeline.set_progress_bar_config(disable=True)
        self.device, self.dtype = torch.device(device), DTYPES[dtype]
        self.guidance_scale, self.negative_prompt = guidance_scale, negative_prompt
        self.path, self.vae_decode_batch = path, vae_decode_batch
        if vae_tiling and getattr(pipeline, "vae", None) is not None:
            pipeline.vae.enable_tiling()
        self.texts = CachedConditioning(self.encode_texts)
        for module in pipeline.components.values():
            if isinstance(module, torch.nn.Module):
                module.requires_grad_(False)
        self.has_lora = lora is not None
        if text_only or vae_only:
            return
        self.trainable = self.trained_module(lora)
        if lora is not None:
            for parameter in self.parameters():  # float32 master weights: a bf16 LoRA loses small updates
                parameter.data = parameter.data.float()

    # --- loading ------------------------------------------------------------------------------------------------

    @classmethod
    @abstractmethod
    def build_tiny(cls):
        """The tiny test pipeline (real classes, shrunk sizes, random weights from torch's current seed)."""

    # --- the trained module -------------------------------------------------------------------------------------

    def trained_module(self, lora) -> torch.nn.Module:
        """The module training updates: the denoiser, with the LoRA adapter added (or unfrozen). A family with
        several denoisers (Wan 2.2's experts) returns a container of those it trains."""
        return with_adapter(getattr(self.pipeline, self.denoiser_name), lora)

    @abstractmethod
    def blocks(self) -> list[torch.nn.Module]:
        """The trained module's repeated blocks: the units FSDP shards (and checkpoints activations of)."""

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.trainable.parameters() if p.requires_grad]

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

    # --- latents ------------------------------------------------------------------------------------------------

    def latent_shape(self, height: int, width: int) -> tuple[int, int, int]:
        factor = self.pipeline.vae_scale_factor
        return self.trainable.config.in_channels, height // factor, width // factor

    def sample_shape(self, sampling) -> tuple[int, ...]:
        """The latent shape of one sample of `train.sampling` (an image's [C, h, w]; a video family's [C, F, h, w])."""
        return self.latent_shape(sampling.height, sampling.width)

    def initial_noise(self, sample_ids: list[str], seed: int, shape: tuple[int, ...]) -> torch.Tensor:
        """float32 latents, bit-identical for a (seed, sample id) whatever the batch."""
        noises = [torch.randn(shape, generator=torch.Generator().manual_seed(sample_seed(seed, s))) for s in sample_ids]
        return torch.stack(noises).to(self.device)

    # --- scheduler and sampler ----------------------------------------------------------------------------------

    @abstractmethod
    def schedule(self, num_steps: int, latent_shape: tuple[int, ...]) -> list:
        """num_steps + 1 values (sigmas or timesteps) the transitions index into, for latents of `latent_shape`
        (what `latent_shape(h, w)` returned: resolution-dependent shifts read it)."""

    @abstractmethod
    def transition(self, x, index, eta, cond, schedule, prev_sample=None, generator=None, sampling=None) -> StepResult:
        """Denoising step `index` from x (float32 [B, C, h, w]) with noise level `eta`; with `prev_sample`, the
        log-prob of that stored transition. `generator`: one, or one per sample. `sampling`: the algorithm's
        `step_sampling` (its sampler and CFG gradient; None: the family's own sampler, both CFG branches)."""

    # the samplers its transitions run (`rollout/samplers`, chosen by `train.algorithm.sde_type`): `flow` (velocity,
    # sigmas: Flow-GRPO's SDE, CPS, DanceGRPO's SDE) or `ddim` (epsilon, alpha-bars: DDIM with eta)
    sampler_kind: ClassVar[str] = "flow"
    # transitions read both noise levels off the schedule list, so rollouts may thin it (`sde_window.post_compress`)
    schedule_indexed: ClassVar[bool] = True

    def step_sampling(self, algorithm) -> StepSampling:
        """How `algorithm` samples and trains on this family: its sampler (`sde_type`) for this family's kind and
        its CFG gradient (`cfg_gradient`). The rollout, the train stack and evaluation pass it to every transition;
        the family keeps nothing of it."""
        from unirl_core.domains.diffusion.rollout.samplers.registry import BUILT_IN, sampler_for
        from unirl_core.errors import UserError

        try:
            sampler = sampler_for(algorithm.sde_type, self.sampler_kind)
        except UserError:
            names = [name for name, kinds in BUILT_IN.items() if self.sampler_kind in kinds]
            raise UserError(
                f"train.algorithm.sde_type: {algorithm.sde_type!r} does not apply to family {self.name!r} "
                f"({self.sampler}); choose one of {', '.join(names)}"
            ) from None
        window = algorithm.sde_window
        if window is not None and window.post_compress is not None and not self.schedule_indexed:
            raise UserError(
                f"train.algorithm.sde_window.post_compress: family {self.name!r} ({self.sampler}) does not step "
                "along a thinned schedule; leave post_compress empty"
            )
        return StepSampling(sampler, algorithm.cfg_gradient == "detach_uncond")

    def sampler_of(self, sampling: StepSampling | None) -> Sampler:
        """`sampling`'s sampler, or this family kind's own (`sde`) when a caller passes none (evaluation)."""
        from unirl_core.domains.diffusion.rollout.samplers.registry import sampler_for

        return sampler_for("sde", self.sampler_kind) if sampling is None else sampling.sampler

    def flow_step(self, velocity, x, index, eta, schedule, prev_sample=None, generator=None, sampling=None):
        """A flow family's step `index` from the guided float32 velocity with `sampling`'s sampler (`sigma_max` =
        the second sigma: Flow-GRPO's std at sigma = 1)."""
        return self.sampler_of(sampling).step(
            velocity, x, schedule[index], schedule[index + 1], eta, level_max=schedule[1], prev_sample=prev_sample,
            generator=generator,
        )  # fmt: skip

    @abstractmethod
    def noised(self, clean: torch.Tensor, noise: torch.Tensor, index: int, schedule) -> torch.Tensor:
        """x at step `index` from a clean latent (image-to-image start)."""

    def noise_level(self, index: int, schedule) -> tuple[float, float]:
        """(alpha, sigma) of x at step `index`, x = alpha x0 + sigma noise, read off `noised` (multistep ODE
        solvers need them; steps 0 to num_steps - 1)."""
        one, zero = torch.ones(()), torch.zeros(())
        return float(self.noised(one, zero, index, schedule)), float(self.noised(zero, one, index, schedule))

    def with_condition_images(self, cond, prompts: list[str], images: list, latents: torch.Tensor):
        """`condition_mode == "reference"`: the conditioning of `prompts` given their condition images (PIL) and
        those images' latents [B, C, h, w] (`encode_images`). Default: the latents ride along as
        `cond["reference"]` (both CFG halves); a family whose text encoder reads the image re-encodes here."""
        reference = latents.to(self.device, torch.float32)
        return {**cond, "reference": torch.cat([reference, reference]) if self.cfg else reference}

    # --- warm-up ------------------------------------------------------------------------------------------------

    @abstractmethod
    def denoising_loss(self, clean_latents: torch.Tensor, cond: Conditioning, generator: Generators) -> torch.Tensor:
        """The supervised (warm-up) loss on scaled clean latents [B, C, h, w] and conditioning without a negative
        half; random draws per sample from `generator` (one, or one per sample)."""

    # --- export -------------------------------------------------------------------------------------------------

    def export_adapter(self, folder: Path, base_path: str) -> None:
        """The LoRA in both forms users load, in one folder:
        - peft: `adapter_config.json` + `adapter_model.safetensors`, `PeftModel.from_pretrained(<denoiser>, folder)`;
        - diffusers: `pytorch_lora_weights.safetensors` (with the LoRA config as metadata, so alpha/rank holds),
          `<Pipeline>.from_pretrained(base).load_lora_weights(folder)`."""
        self.export_module_adapter(self.trainable, folder, base_path, self.denoiser_name)

    def export_module_adapter(self, module, folder: Path, base_path: str, component: str) -> None:
        """`module`'s LoRA (the pipeline's `component`) into `folder`, in both forms (see `export_adapter`)."""
        import diffusers
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        state = {k: v.contiguous() for k, v in get_peft_model_state_dict(module, adapter_name="default").items()}
        # PeftModel's own layout: keys under base_model.model., the config with the base model's location
        save_file({f"base_model.model.{k}": v for k, v in state.items()}, str(folder / "adapter_model.safetensors"))
        peft_config = sorted_sets(module.peft_config["default"])
        peft_config.base_model_name_or_path = f"{base_path}/{component}"
        peft_config.save_pretrained(str(folder))
        getattr(diffusers, self.lora_pipeline_class or self.pipeline_class).save_lora_weights(
            str(folder), **{f"{self.denoiser_name}_lora_layers": state,
                            f"{self.denoiser_name}_lora_adapter_metadata": peft_config.to_dict()},
        )  # fmt: skip
        canonical_header(folder / "pytorch_lora_weights.safetensors")

    def export_merged(self, folder: Path, base_path: str) -> None:
        """The whole pipeline with the LoRA merged into the denoiser's base weights (`save_pretrained`)."""
        merged = merged_state(self.trainable, self.has_lora)
        base = type(self)(base_path, dtype=str(self.dtype).removeprefix("torch."), lora=None)
        getattr(base.pipeline, self.denoiser_name).load_state_dict(merged, strict=True)
        base.pipeline.save_pretrained(str(folder))


def merged_state(module: torch.nn.Module, has_lora: bool) -> dict:
    """`module`'s state dict with its LoRA merged into the base weights (under the base layers' own names)."""
    if not has_lora:
        return module.state_dict()
    from peft.tuners.tuners_utils import BaseTunerLayer

    for layer in module.modules():
        if isinstance(layer, BaseTunerLayer):
            layer.merge()
    return {k.replace(".base_layer.", "."): v for k, v in module.state_dict().items() if "lora_" not in k}


def with_adapter(module: torch.nn.Module, lora) -> torch.nn.Module:
    """`module` with the recipe's LoRA adapter added (gaussian init: B starts at zero), or unfrozen without one."""
    if lora is None:
        module.requires_grad_(True)
        return module
    from peft import LoraConfig

    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), init_lora_weights="gaussian"
    )
    module.add_adapter(config)
    return module


def canonical_header(path: Path) -> None:
    """Rewrite a safetensors file's JSON header with sorted keys (the tensor data untouched: its offsets are relative
    to the data that follows the header). safetensors writes `__metadata__` in its Rust map's per-process order, so
    the same tensors and metadata would give different bytes from each process."""
    import json
    import struct

    from unirl_core.io.storage import write_bytes_atomic

    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.dumps(json.loads(data[8 : 8 + length]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # the format's 8-byte alignment of the data
    write_bytes_atomic(str(path), struct.pack("<Q", len(header)) + header + data[8 + length :])


def sorted_sets(peft_config):
    """A copy of `peft_config` whose set-valued fields (`target_modules`, ...) are sorted lists: peft keeps them as
    sets, which each process writes in its own hash order, so identical weights would export different bytes."""
    import copy
    import dataclasses

    config = copy.deepcopy(peft_config)
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, set | frozenset):
            setattr(config, field.name, sorted(value, key=str))
    return config
