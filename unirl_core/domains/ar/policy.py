"""The autoregressive policy: a transformers causal LM from a local folder (LoRA through peft, or every weight
trained), batched sampling with a KV cache, and per-token log-probs at training geometry.

    prompts  -> token ids, left-padded [B, P] (+ mask)           `encode`
    sampling -> completions right-padded [B, T] (+ mask), log-probs [B, T] of the tokens drawn
    training -> log-probs [B, T] of the same tokens, one forward over [prompt | completion]

Every draw of sample i comes from its own generator (seeded from (seed, step, sample id) by the caller), so a
sample's completion does not depend on which rank or batch it is generated in. A log-prob is that of
log_softmax(logits / temperature), with no top-p renormalization (TRL's and veRL's convention): the sampling pass and
the training forward compute the same quantity, so the first update's ratio is exactly 1 on one rank.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass
class Completions:
    """A batch of generated completions (row i: sample i)."""

    prompt_ids: torch.Tensor  # [B, P] left-padded
    prompt_mask: torch.Tensor  # [B, P]
    ids: torch.Tensor  # [B, T] right-padded with the pad token after the end
    mask: torch.Tensor  # [B, T] 1 on generated tokens up to and including the end (EOS or stop string)
    logp: torch.Tensor  # [B, T] float32 log-probs of `ids` when drawn (0 where masked)
    texts: list[str]  # decoded completions, special tokens dropped
    truncated: list[bool]  # reached max_new_tokens without an end

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: 0 at each row's first real token (pads get 0 too)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """`logits` [B, V] with the tokens outside each row's top-p nucleus set to -inf (the top token always kept)."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(-1, descending=True)
    before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)  # mass of the tokens ranked above
    sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


class LMPolicy:
    """What the worker shards and checkpoints (`trainable`, `blocks()`, `dtype`, `parameters()`), with the
    tokenizer and the generation settings of `train.domain`."""

    def __init__(self, config, device):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from unirl_core.models.registry import resolve_model_path

        self.settings, self.device = config.domain, torch.device(device)
        path = resolve_model_path(config.model.path)
        self.dtype = getattr(torch, config.model.dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        model.config.use_cache = True
        self.has_lora = config.model.lora is not None
        if self.has_lora:
            from peft import LoraConfig, get_peft_model

            lora = config.model.lora
            model.requires_grad_(False)
            model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0,
                                                     target_modules=list(lora.target_modules)))  # fmt: skip
        self.trainable = model.to(self.device)
        self.trainable.train(False)  # no dropout: rollout and training see the same function
        ends = model.generation_config.eos_token_id if model.generation_config is not None else None
        ends = ends if isinstance(ends, list) else [ends] if ends is not None else []
        self.end_ids = sorted({*ends, self.tokenizer.eos_token_id} - {None})
        # transformers >= 5.2x names the KV cache `cache` (`past_key_values` warns, then goes in 5.40)
        forward = inspect.signature(type(self.base_model()).forward).parameters
        self._cache_key = "cache" if "cache" in forward else "past_key_values"

    # --- what the worker reads ------------------------------------------------------------------------------

    def base_model(self) -> torch.nn.Module:
        """The transformers model under the peft wrapper (the model itself without LoRA)."""
        return self.trainable.get_base_model() if self.has_lora else self.trainable

    def blocks(self) -> list[torch.nn.Module]:
        """The decoder layers (FSDP2 units)."""
        return list(self.base_model().model.layers)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.trainable.parameters() if p.requires_grad]

    # --- prompts and completions ----------------------------------------------------------------------------

    def prompt_text(self, prompt: str) -> str:
        """What the model reads for `prompt`: its chat-template user turn (with the generation prompt), or itself."""
        if not self.settings.chat_template:
            return prompt
        turns = [{"role": "system", "content": self.settings.system_prompt}] if self.settings.system_prompt else []
        turns.append({"role": "user", "content": prompt})
        return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ids [B, P] and mask of `prompts` (chat template applied per `train.domain.chat_template`)."""
        batch = self.tokenizer([self.prompt_text(p) for p in prompts], return_tensors="pt", padding=True,
                               add_special_tokens=False)  # fmt: skip
        return batch.input_ids.to(self.device), batch.attention_mask.to(self.device)

    @torch.no_grad()
    def generate(self, prompts: list[str], generators: list[torch.Generator] | None) -> Completions:
        """Completions of `prompts` drawn with `generators` (one per prompt; None: greedy), with a KV cache."""
        from transformers import DynamicCache

        settings = self.settings
        prompt_ids, prompt_mask = self.encode(prompts)
        rows = prompt_ids.shape[0]
        pad = self.tokenizer.pad_token_id
        ends = torch.tensor(self.end_ids, device=self.device)
        cache, mask = DynamicCache(), prompt_mask
        step_ids, step_positions = prompt_ids, positions(prompt_mask)
        tokens, logps, live = [], [], torch.ones(rows, dtype=torch.bool, device=self.device)
        alive_masks = []
        for _ in range(settings.max_new_tokens):
            out = self.trainable(input_ids=step_ids, attention_mask=mask, position_ids=step_positions,
                                 use_cache=True, **{self._cache_key: cache})  # fmt: skip
            cache = out[self._cache_key]
            logits = out.logits[:, -1].float() / settings.temperature
            logp_all = torch.log_softmax(logits, -1)
            if generators is None:
                token = logits.argmax(-1)
            else:
                probs = nucleus(logits, settings.top_p).softmax(-1).cpu()
                token = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in
                                   zip(probs, generators, strict=True)]).to(self.device)  # fmt: skip
            token = torch.where(live, token, torch.full_like(token, pad))
            tokens.append(token)
            logps.append(torch.where(live, logp_all.gather(-1, token[:, None])[:, 0], 0.0))
            alive_masks.append(live.clone())
            live = live & ~torch.isin(token, ends)
            if settings.stop:
                live = live & ~self._stopped(torch.stack(tokens, 1))
            if not live.any():
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            step_ids, step_positions = token[:, None], step_positions[:, -1:] + 1
        ids, completion_mask = torch.stack(tokens, 1), torch.stack(alive_masks, 1).long()
        texts = self.tokenizer.batch_decode(ids.masked_fill(completion_mask == 0, pad), skip_special_tokens=True)
        return Completions(prompt_ids, prompt_mask, ids, completion_mask, torch.stack(logps, 1), texts,
                           live.tolist())  # fmt: skip

    def _stopped(self, ids: torch.Tensor) -> torch.Tensor:
        """[B] whether each row's completion so far contains a stop string."""
        texts = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return torch.tensor([any(s in t for s in self.settings.stop) for t in texts], device=self.device)

    # --- log-probs at training geometry ---------------------------------------------------------------------

    def token_logp(self, completions: Completions, index: torch.Tensor | slice = slice(None),
                   entropy: bool = False):  # fmt: skip
        """float32 log-probs [b, T] of the completion tokens of rows `index`, one forward over [prompt |
        completion] (the completion's own mask: tokens after its end are not attended); with `entropy`, also each
        position's entropy [b, T] (no gradient)."""
        prompt_ids, ids = completions.prompt_ids[index], completions.ids[index]
        mask = torch.cat([completions.prompt_mask[index], completions.mask[index]], 1)
        logits = self.trainable(input_ids=torch.cat([prompt_ids, ids], 1), attention_mask=mask,
                                position_ids=positions(mask), use_cache=False).logits  # fmt: skip
        logp_all = torch.log_softmax(logits[:, prompt_ids.shape[1] - 1 : -1].float() / self.settings.temperature, -1)
        logp = logp_all.gather(-1, ids[..., None])[..., 0]
        if not entropy:
            return logp
        with torch.no_grad():
            return logp, -(logp_all.exp() * logp_all).sum(-1)

    def reference(self):
        """A context in which `token_logp` is the reference policy's: the model with its LoRA adapter disabled (a KL
        term with full fine-tuning is refused on loading the recipe)."""
        return self.trainable.disable_adapter()
