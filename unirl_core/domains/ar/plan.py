"""`unirl plan` for the autoregressive domain: parameters and per-worker memory of a causal LM recipe at its real
size, from the model's config on the meta device (a variant name, or a local folder's config.json; no weights).

Terms (bytes; b = the model dtype's bytes, W = workers, N = completions per worker, M = the micro-batch, S = prompt
+ completion tokens (`PROMPT_TOKENS` + `max_new_tokens`, and a VLM's image tokens: (image_size / (patch x merge))^2
for a Qwen-VL, the vision config's tokens per image for a LLaVA), h = hidden size, L = decoder layers, V =
vocabulary; a VLM's vision tower counts in the weights):
    weights       P b / W + P_layer b              (FSDP2's shard + one all-gathered decoder layer)
    trainable     16 P_trainable / W                (fp32 weight, gradient, Adam's two moments)
    KV cache      N S L 2 kv_heads head_dim b       (generation: every completion's keys and values)
    activations   M S h 34 b/2 x L                  (Korthikanti et al. 2022; with activation checkpointing
                  or x (2 L/34 + 1)                  the layer inputs plus one layer recomputed)
    logits        M S V (b + 8)                     (the logits, their float32 copy and float32 log-softmax)
An estimate (+-30%): it names the largest term, which is what a user changes (workers, micro-batch, checkpointing,
max_new_tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from unirl_core.controller.memory import GIB, MemoryPlan
from unirl_core.models.components import QWEN2_5_VL_7B, QWEN3_4B, QWEN3_8B
from unirl_core.models.dtypes import DTYPES

PROMPT_TOKENS = 256  # prompt tokens assumed per completion (a chat-templated question)
LM_VARIANTS = {"qwen3-8b": QWEN3_8B, "qwen3-4b": QWEN3_4B, "qwen2.5-vl-7b": QWEN2_5_VL_7B}  # published configs


def _meta_model(source: str) -> torch.nn.Module:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    if source in LM_VARIANTS:
        _, _, config_class, values = LM_VARIANTS[source]
        config = getattr(transformers, config_class)(**values)
    else:
        config = AutoConfig.from_pretrained(source)
    loader = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    with torch.device("meta"):
        return loader.from_config(config)


def image_tokens(config, model_config) -> int:
    """The tokens of one condition image for a VLM (0 for a causal LM): a Qwen-VL's merged patches of an
    `image_size` square, or a LLaVA's fixed count per image."""
    vision = getattr(model_config, "vision_config", None)
    if vision is None:
        return 0
    if hasattr(vision, "spatial_merge_size"):
        return (config.domain.image_size // (vision.patch_size * vision.spatial_merge_size)) ** 2
    return getattr(model_config, "image_seq_length", None) or (vision.image_size // vision.patch_size) ** 2


def _trainable(model: torch.nn.Module, lora) -> int:
    if lora is None:
        return sum(p.numel() for p in model.parameters())
    from peft import LoraConfig, get_peft_model

    with torch.device("meta"):
        wrapped = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha,
                                                   target_modules=list(lora.target_modules)))  # fmt: skip
    return sum(p.numel() for name, p in wrapped.named_parameters() if "lora_" in name)


def lm_memory_plan(config, source: str) -> MemoryPlan:
    """The plan of TrainConfig `config` (domain `ar`) with the model of `source` (an LM_VARIANTS name or a folder)."""
    model = _meta_model(source)
    lm = model.config.get_text_config()
    layers = getattr(model.model, "language_model", model.model).layers
    parameters = sum(p.numel() for p in model.parameters())
    largest_layer = max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    trainable = _trainable(model, config.model.lora)
    b, workers = DTYPES[config.model.dtype].itemsize, config.ray.workers
    samples = config.data.prompts_per_rollout * config.sampling.samples_per_prompt // workers
    tokens = PROMPT_TOKENS + image_tokens(config, model.config) + config.domain.max_new_tokens
    micro = min(config.algorithm.micro_batch_size, samples)
    head_dim = getattr(lm, "head_dim", None) or lm.hidden_size // lm.num_attention_heads
    kv = 2 * len(layers) * lm.num_key_value_heads * head_dim
    weights = {"weights (shard + one layer)": (parameters / workers + largest_layer) * b}
    per_layer = micro * tokens * lm.hidden_size * 34 * b / 2
    checkpointing = config.fsdp.activation_checkpointing
    activations = per_layer * (2 * len(layers) / 34 + 1 if checkpointing else len(layers))
    rollout = {**weights, "KV cache": samples * tokens * kv * b}
    training = {
        **weights,
        "trainable: weights, gradients, Adam": 16 * trainable / workers,
        "activations" + (" (checkpointed)" if checkpointing else ""): activations,
        "logits and log-probs": micro * tokens * lm.vocab_size * (b + 8),
    }
    return MemoryPlan(
        source=source, family="vlm" if hasattr(model.config, "vision_config") else "causal_lm", parameters={"model": parameters}, trainable=trainable, workers=workers,
        samples_per_worker=samples, tokens=tokens,
        rollout={k: v / GIB for k, v in rollout.items()}, training={k: v / GIB for k, v in training.items()},
    )  # fmt: skip


def plan_source(config, variant: str | None) -> str:
    """Where the plan's config comes from: `variant`, else `train.model.path` (a folder with config.json); a
    ValueError says what to pass instead."""
    from unirl_core.models.registry import resolve_model_path

    if variant is not None:
        if variant not in LM_VARIANTS:
            raise ValueError(f"--variant {variant!r} is not a causal LM or VLM; variants: {', '.join(LM_VARIANTS)}")
        return variant
    folder = Path(resolve_model_path(config.model.path))
    if not (folder / "config.json").is_file() or "model_type" not in json.loads((folder / "config.json").read_text()):
        raise ValueError(f"train.model.path {config.model.path!r} is not a local transformers model folder "
                         f"(config.json); pass --variant, one of: {', '.join(LM_VARIANTS)}")  # fmt: skip
    return str(folder)
