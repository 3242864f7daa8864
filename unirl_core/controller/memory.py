"""`unirl plan`: parameters and an estimate of per-worker memory for a recipe at its real model size, from the
components built on the meta device (no weights, seconds).

Terms (bytes; b = the model dtype's bytes, W = workers; FSDP2 shards the trained module over the workers):
    denoiser      P_denoiser b / W + P_largest_block b           (its shard + one all-gathered block)
    text/VAE      P b each, on every worker                       (frozen, not sharded; text encoders 0 when they
                                                                   are kept on the CPU: `model.text_encoders`)
    trainable     16 P_trainable / W                              (fp32 weight, gradient, Adam's two moments)
    rollout       N (1 + cfg) S h 12 b/2                          (one block's transients, no gradients: N samples
                                                                   per worker, S tokens (a video's: every latent
                                                                   frame's), h the width)
    VAE decode    n C0 H W 6 b                                    (a chunk of n = `model.vae_decode_batch` images at
                                                                   full resolution (512 px tiles with `vae_tiling`),
                                                                   C0 the decoder's widest full-resolution channels;
                                                                   x 4 frames for Wan's causal video VAE)
    training      M (1 + cfg) S h 34 b/2 x L                      (Korthikanti et al. 2022: ~34 s b h bytes per
                  or x (2 L/34 + 1) with activation checkpointing  transformer layer at 16 bit; M the micro-batch)
It is an estimate (+-30% on transformers; a UNet's per-level widths and token counts are folded into its first
level's): it names the largest term, which is what a user changes (workers, micro-batch, checkpointing, caching).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from pydantic import BaseModel, ConfigDict

from unirl_core.models.dtypes import DTYPES
from unirl_core.models.real_sizes import VARIANTS, meta_pipeline, parameter_count

GIB = 1024**3
TEXT_TOKENS_UNKNOWN = 256  # conditioning length assumed for a folder whose variant is unknown


class MemoryPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: str  # the variant name or the pipeline folder the configs came from
    family: str
    parameters: dict[str, int]  # component -> parameters (+ buffers)
    trainable: int
    workers: int
    samples_per_worker: int
    tokens: int  # image tokens + conditioning tokens per sample
    rollout: dict[str, float]  # term -> GiB per worker
    training: dict[str, float]

    @property
    def rollout_total(self) -> float:
        return sum(self.rollout.values())

    @property
    def training_total(self) -> float:
        return sum(self.training.values())

    def largest(self) -> tuple[str, float]:
        terms = {**{f"rollout: {k}": v for k, v in self.rollout.items()},
                 **{f"training: {k}": v for k, v in self.training.items()}}  # fmt: skip
        return max(terms.items(), key=lambda item: item[1])


def _width(config) -> int:
    heads, head_dim = getattr(config, "num_attention_heads", None), getattr(config, "attention_head_dim", None)
    if isinstance(heads, int) and isinstance(head_dim, int):
        return heads * head_dim
    return config.block_out_channels[0]  # a UNet: its first (full latent resolution) level


def _trainable(denoisers: list[torch.nn.Module], lora) -> int:
    if lora is None:
        return sum(p.numel() for denoiser in denoisers for p in denoiser.parameters())
    from peft import LoraConfig

    with torch.device("meta"):
        for denoiser in denoisers:
            denoiser.add_adapter(LoraConfig(r=lora.rank, lora_alpha=lora.alpha,
                                            target_modules=list(lora.target_modules)))  # fmt: skip
    return sum(p.numel() for denoiser in denoisers for name, p in denoiser.named_parameters() if "lora_" in name)


def _denoisers(family, components: dict, experts: list[str] | None) -> tuple[dict[str, torch.nn.Module], list]:
    """The trained denoisers by component name (the family's one, or the experts that train: Wan 2.2) and their
    blocks."""
    names = (experts or list(family.expert_names)) if family.expert_names else [family.denoiser_name]
    denoisers = {name: components[name] for name in names}
    blocks = [block for module in denoisers.values() for block in family.blocks(SimpleNamespace(trainable=module))]
    return denoisers, blocks


def _weights(family, model, parameters: dict, largest_block: int, workers: int, text: int, b: int) -> dict:
    """Bytes of the weights every phase holds: the denoiser's shard plus one gathered block (every expert of a
    family with several: the rollout runs them all), the text encoders (none on the device when they live on the
    CPU), the VAE."""
    denoiser = sum(parameters[name] for name in (family.expert_names or (family.denoiser_name,)))
    from unirl_core.models.parts.text import text_encoder_placement

    placement = text_encoder_placement(
        model.text_encoders, "cuda", bool(model.text_embedding_cache), family.text_only_conditioning
    )
    return {
        "denoiser weights (shard + one block)": (denoiser / workers + largest_block) * b,
        "text encoders" + (" (on the CPU)" if placement == "cpu" else ""): 0 if placement == "cpu" else text * b,
        "VAE": parameters.get("vae", 0) * b,
        **({"image encoder": parameters["image_encoder"] * b} if "image_encoder" in parameters else {}),
    }


def _vae_decode(model, sampling, samples: int, vae_width: int, b: int, frames: int = 1) -> dict:
    """{label: bytes} of the rollout's VAE decode: a chunk of `vae_decode_batch` images (tiles of 512 px squares,
    plus overlap, with `vae_tiling`); a video VAE decodes `frames` pixel frames at a time (Wan's: one latent
    frame, 4 pixel frames, with its causal cache)."""
    decode_pixels = sampling.height * sampling.width * frames
    if model.vae_tiling:
        decode_pixels = min(sampling.height, 512) * min(sampling.width, 512)
    decode_batch = min(model.vae_decode_batch, samples)
    label = f"VAE decode (chunks of {decode_batch}{', tiled' if model.vae_tiling else ''})"
    return {label: decode_batch * vae_width * decode_pixels * 6 * b}


def _latent_frames(family, sampling) -> int:
    """Latent frames of one sample: 1 for images, (num_frames - 1) / temporal stride + 1 for videos."""
    if family.outputs != "video":
        return 1
    return ((sampling.num_frames or 1) - 1) // family.temporal_stride + 1


def _tokens(family, sampling, variant: dict) -> int:
    """Tokens of one sample in the denoiser: the image's (twice with an edit model's reference image; every latent
    frame's for a video) and the text's (the variant's, else a typical count)."""
    stride = family.latent_stride
    image_tokens = (sampling.height // stride) * (sampling.width // stride) * _latent_frames(family, sampling)
    return image_tokens * (2 if variant.get("reference_image") else 1) + variant.get("text_tokens", TEXT_TOKENS_UNKNOWN)


def _activations(per_layer: float, layers: int, checkpointing: bool) -> dict:
    """{label: bytes} of the training forward's activations: every layer's, or with activation checkpointing the
    block inputs plus one layer's recomputed."""
    if checkpointing:
        return {"activations (checkpointed)": per_layer * (2 * layers / 34 + 1)}
    return {"activations": per_layer * layers}


def memory_plan(config, source: str) -> MemoryPlan:
    """The plan of TrainConfig `config` with the components of `source` (a variant name or a pipeline folder)."""
    from unirl_core.models.registry import family_class

    family = family_class(config.model.family)
    components = meta_pipeline(source)
    denoisers, blocks = _denoisers(family, components, config.model.experts)
    largest_block = max(parameter_count(block) for block in blocks)
    parameters = {name: parameter_count(module) for name, module in components.items()}
    trainable = _trainable(list(denoisers.values()), config.model.lora)

    b = DTYPES[config.model.dtype].itemsize
    workers = config.ray.workers
    sampling = config.sampling
    samples = config.data.prompts_per_rollout * sampling.samples_per_prompt // workers
    cfg = 2 if sampling.guidance_scale > 1.0 and family.cfg_branch else 1
    tokens = _tokens(family, sampling, VARIANTS.get(source, {}))
    width = _width(next(iter(denoisers.values())).config)
    micro = config.algorithm.micro_batch_size or samples
    text = sum(v for k, v in parameters.items() if k.startswith("text_encoder"))
    vae_config = getattr(components.get("vae"), "config", None)
    vae_width = min(getattr(vae_config, "block_out_channels", None) or [getattr(vae_config, "base_dim", 128)])

    model = config.model
    weights = _weights(family, model, parameters, largest_block, workers, text, b)
    decode = _vae_decode(model, sampling, samples, vae_width, b, max(1, family.temporal_stride))
    per_layer = micro * cfg * tokens * width * 34 * b / 2
    rollout = {
        **weights,
        "denoiser activations": samples * cfg * tokens * width * 12 * b / 2,
        **decode,
    }
    training = {
        **weights,
        "trainable: weights, gradients, Adam": 16 * trainable / workers,
        **_activations(
            per_layer, len(blocks) // len(denoisers), config.fsdp.activation_checkpointing
        ),  # one expert a step
    }
    return MemoryPlan(
        source=source, family=family.name, parameters=parameters, trainable=trainable, workers=workers,
        samples_per_worker=samples, tokens=tokens,
        rollout={k: v / GIB for k, v in rollout.items()}, training={k: v / GIB for k, v in training.items()},
    )  # fmt: skip


def format_plan(plan: MemoryPlan) -> str:
    lines = [f"model: {plan.family} from {plan.source} (configs only, no weights)"]
    for name, count in plan.parameters.items():
        lines.append(f"  {name:<16} {count / 1e9:8.3f} B parameters")
    lines.append(f"  trainable        {plan.trainable / 1e6:8.2f} M parameters")
    lines.append(
        f"per worker ({plan.workers} workers, {plan.samples_per_worker} samples each, {plan.tokens} tokens a sample):"
    )
    for title, terms, total in (("rollout", plan.rollout, plan.rollout_total),
                                ("training", plan.training, plan.training_total)):  # fmt: skip
        lines.append(f"  {title}: {total:.1f} GiB")
        lines += [f"    {name:<40} {gib:7.2f} GiB" for name, gib in terms.items()]
    name, gib = plan.largest()
    lines.append(f"largest term: {name} ({gib:.1f} GiB)")
    return "\n".join(lines)
