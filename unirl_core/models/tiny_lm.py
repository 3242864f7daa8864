"""Tiny causal LMs, random weights, for the autoregressive domain's tests and CPU demo: `tiny:qwen3` and
`tiny:qwen2` (and the tiny VLMs, `tiny:llava`, `tiny:qwen2_5_vl` and `tiny:qwen3_vl`) in `train.model.path` build one in the workspace once (as
`tiny:<family>` does for diffusion).

| part      | size                                                                                          |
|-----------|-----------------------------------------------------------------------------------------------|
| decoder   | Qwen3 (or Qwen2, as Qwen2.5), hidden 64, 2 layers, 4 heads (2 kv) of 16, MLP 128, untied head  |
| tokenizer | byte-level BPE on the 256 byte symbols plus ChatML tokens (`models.tiny_vlm.tiny_qwen_tokenizer`) |

The folder is what a real Qwen checkpoint folder is (config.json, model.safetensors, tokenizer files with the ChatML
chat template): `AutoModelForCausalLM` and `AutoTokenizer.from_pretrained(folder)` load it offline.
"""

from __future__ import annotations

from pathlib import Path

import torch

# the VLMs: llava (models/tiny_vlm.py: LLaVA with a Qwen2 decoder), qwen2_5_vl and qwen3_vl (tiny_qwen_vl.py: M-RoPE)
TINY_LMS = ("qwen3", "qwen2", "llava", "qwen2_5_vl", "qwen3_vl")


def build_tiny_lm(arch: str = "qwen3", seed: int = 0):
    """(model, tokenizer) of the tiny `arch`, weights drawn from `seed` (same seed, same weights)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from unirl_core.models.tiny_vlm import tiny_qwen_tokenizer

    if arch not in TINY_LMS[:2]:
        raise ValueError(f"tiny LM {arch!r} is unknown: choose one of {', '.join(TINY_LMS[:2])}")
    tokenizer = tiny_qwen_tokenizer()
    pad_id, eos_id = (tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>"))
    classes = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    config_class, model_class = classes[arch]
    config = config_class(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                          tie_word_embeddings=False, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
                          initializer_range=0.1)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    return model.eval(), tokenizer


def write_tiny_lm(folder: str | Path, arch: str = "qwen3", seed: int = 0) -> Path:
    """Write the tiny `arch` (about 150 KB) where `AutoModelForCausalLM`/`AutoTokenizer.from_pretrained` load it
    (the VLMs `llava`, `qwen2_5_vl` and `qwen3_vl`: which `AutoModelForImageTextToText` and their processors load)."""
    if arch == "llava":
        from unirl_core.models.tiny_vlm import write_tiny_vlm

        return write_tiny_vlm(folder, seed)
    if arch in ("qwen2_5_vl", "qwen3_vl"):
        from unirl_core.models.tiny_qwen_vl import write_tiny_qwen_vl

        return write_tiny_qwen_vl(folder, seed, arch)
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder; choose a new folder or remove it")
    model, tokenizer = build_tiny_lm(arch, seed)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
