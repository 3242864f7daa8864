"""`train.domain` of the autoregressive domain: how completions are generated from the prompts."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from unirl_core.config.schema_base import Count
from unirl_core.domains.base import DomainConfig


class ARDomainConfig(DomainConfig):
    """`train.domain` with `name: ar`: the policy is `train.model.path` (a transformers causal-LM or VLM folder, or
    `tiny:qwen3` / `tiny:qwen2` / `tiny:llava` / `tiny:qwen2_5_vl` / `tiny:qwen3_vl`), trained with LoRA (`train.model.lora`, e.g. target_modules [q_proj, k_proj,
    v_proj, o_proj]) or fully (`lora: null`)."""

    name: Literal["ar"] = "ar"

    max_new_tokens: Annotated[Count, Field(ge=1)] = 256
    """Tokens generated per completion at most (a completion that reaches it is `truncated`)."""

    temperature: Annotated[float, Field(gt=0)] = 1.0
    """Sampling temperature. The log-probs of the rollout and of training are those of the logits / temperature
    (as TRL and veRL compute them), whatever `top_p` leaves out."""

    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling: draw from the smallest set of tokens whose probability reaches `top_p` (1: all)."""

    stop: list[str] = []
    """Strings that end a completion (kept in it), besides the tokenizer's end-of-sequence token."""

    chat_template: bool = True
    """Wrap each prompt as a user turn in the tokenizer's chat template (with the assistant's generation prompt);
    false: the prompt text is the model's input as it is."""

    system_prompt: str | None = None
    """A system turn before each prompt (`chat_template` only); empty: the template's default."""

    image_size: Annotated[Count, Field(ge=8)] = 448
    """A VLM's condition images (`media_refs` role `condition`) are center-cropped to this square before its
    processor (which resizes them to the vision tower's input)."""

    overlong_buffer: Annotated[Count, Field(ge=1)] | None = None
    """DAPO's overlong reward shaping: the last `overlong_buffer` tokens before `max_new_tokens` cost a reward term
    `overlong` that falls linearly from 0 to -`overlong_penalty` (DAPO: 4096 of 20480); empty: none."""

    overlong_penalty: Annotated[float, Field(gt=0)] = 1.0
    """The `overlong` term at `max_new_tokens` tokens (veRL's `penalty_factor`)."""

    eval_mode: Literal["greedy", "sample"] = "greedy"
    """Evaluation completions (`unirl eval`, `train.eval`): greedy, or sampled with the evaluation seed."""
