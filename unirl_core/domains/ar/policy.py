"""The autoregressive policy: a transformers causal LM from a local folder (LoRA through peft, or every weight
trained), batched sampling with a KV cache, and per-token log-probs at training geometry.

    prompts  -> token ids, left-padded [B, P] (+ mask)           `encode`
    sampling -> completions right-padded [B, T] (+ mask), log-probs [B, T] of the tokens drawn
    training -> log-probs [B, T] of the same tokens, one forward over [prompt | completion]

Every draw of sample i comes from its own generator (seeded from (seed, step, sample id) by the caller), so a
sample's completion does not depend on which rank or batch it is generated in. A log-prob is that of
log_softmax(logits / temperature), with no top-p renormalization (TRL's and veRL's convention): the sampling pass and
the training forward compute the same quantity, so the first update's ratio is exactly 1 on one rank. A VLM's image
and video placeholder tokens are out of the support of both.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch

from unirl_core.domains.ar.vision import MROPE_MODELS, MRope, images_of, is_vlm_folder, load_processor, model_type


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
    vision: dict = field(default_factory=dict)  # a VLM's image inputs (pixel_values, ...), one entry per image
    has_image: list[bool] = field(default_factory=list)  # row i's prompt carries an image (in row order)
    pad: int = 0  # the tokenizer's pad token id (what `extend` pads with)

    @property
    def lengths(self) -> torch.Tensor:
        return self.mask.sum(-1)

    def extend(self, other: Completions) -> Completions:
        """These rows then `other`'s (dynamic sampling's later rollouts), prompts left-padded and completions
        right-padded with the pad token to the longer of the two (masks 0, log-probs 0 there)."""
        pad = self.pad
        width, length = (
            max(self.prompt_ids.shape[1], other.prompt_ids.shape[1]),
            max(self.ids.shape[1], other.ids.shape[1]),
        )

        def left(t, value):
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        def right(t, value):
            return torch.nn.functional.pad(t, (0, length - t.shape[1]), value=value)

        pairs = (self, other)
        vision = {k: torch.cat([c.vision[k] for c in pairs if k in c.vision]) for k in {*self.vision, *other.vision}}
        return Completions(torch.cat([left(c.prompt_ids, pad) for c in pairs]),
                           torch.cat([left(c.prompt_mask, 0) for c in pairs]),
                           torch.cat([right(c.ids, pad) for c in pairs]), torch.cat([right(c.mask, 0) for c in pairs]),
                           torch.cat([right(c.logp, 0.0) for c in pairs]), self.texts + other.texts,
                           self.truncated + other.truncated, vision,
                           self.has_image + other.has_image, pad)  # fmt: skip

    def vision_of(self, index) -> dict:
        """The image inputs of rows `index` (in row order), or {} when none of them has an image."""
        if not self.vision:
            return {}
        rows = list(range(len(self.ids)))[index] if isinstance(index, slice) else index.tolist()
        images = [sum(self.has_image[:row]) for row in rows if self.has_image[row]]
        return images_of(self.vision, images) if images else {}


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
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

        from unirl_core.models.registry import resolve_model_path

        self.settings, self.device = config.domain, torch.device(device)
        path = resolve_model_path(config.model.path)
        self.dtype = getattr(torch, config.model.dtype)
        self.is_vlm = is_vlm_folder(path)
        self.processor = load_processor(path) if self.is_vlm else None
        self.tokenizer = self.processor.tokenizer if self.is_vlm else AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        loader = AutoModelForImageTextToText if self.is_vlm else AutoModelForCausalLM
        model = loader.from_pretrained(path, dtype=self.dtype)
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
        # a VLM never generates its image/video placeholder tokens (the processor expands them; one drawn in a
        # completion would ask for image features that do not exist): out of the support, sampled and trained
        placeholders = [getattr(self.processor, name, None) for name in ("image_token", "video_token")]
        self.blocked = torch.tensor([self.tokenizer.convert_tokens_to_ids(t) for t in placeholders if t],
                                    dtype=torch.long, device=self.device)  # fmt: skip
        # transformers >= 5.2x names the KV cache `cache` (`past_key_values` warns, then goes in 5.40)
        forward = inspect.signature(type(self.base_model()).forward).parameters
        self._cache_key = "cache" if "cache" in forward else "past_key_values"
        self.mrope = None  # a Qwen-VL model's 3-D positions (vision.py)
        if model_type(path) in MROPE_MODELS:
            self.mrope = MRope(self.base_model().model, self.processor.image_token_id,
                               getattr(self.processor, "video_token_id", None))  # fmt: skip

    # --- what the worker reads ------------------------------------------------------------------------------

    def base_model(self) -> torch.nn.Module:
        """The transformers model under the peft wrapper (the model itself without LoRA)."""
        return self.trainable.get_base_model() if self.has_lora else self.trainable

    def blocks(self) -> list[torch.nn.Module]:
        """The decoder layers (FSDP2 units; a VLM's are its language model's)."""
        inner = self.base_model().model
        return list(getattr(inner, "language_model", inner).layers)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.trainable.parameters() if p.requires_grad]

    # --- prompts and completions ----------------------------------------------------------------------------

    def prompt_text(self, prompt: str, image: bool = False) -> str:
        """What the model reads for `prompt`: its chat-template user turn (with the generation prompt; a VLM's image
        part first when it has one), or itself (a VLM's image token first)."""
        if not self.settings.chat_template:
            return f"{self.processor.image_token}\n{prompt}" if image else prompt
        turns = [{"role": "system", "content": self.settings.system_prompt}] if self.settings.system_prompt else []
        if self.is_vlm:
            turns.append({"role": "user", "content": [{"type": "image"}] * image + [{"type": "text", "text": prompt}]})
            return self.processor.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        turns.append({"role": "user", "content": prompt})
        return self.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)

    def encode(self, prompts: list[str], images: list | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Left-padded ids [B, P], mask and a VLM's image inputs of `prompts` (`images`: a PIL image or None per
        prompt; chat template per `train.domain.chat_template`)."""
        images = images or [None] * len(prompts)
        texts = [self.prompt_text(p, image is not None) for p, image in zip(prompts, images, strict=True)]
        given = [image for image in images if image is not None]
        if given and not self.is_vlm:
            raise ValueError("prompts with images (media_refs role condition) need a VLM in train.model.path")
        if self.is_vlm:
            batch = self.processor(text=texts, images=given or None, padding=True, return_tensors="pt")
        else:
            batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        text_keys = ("input_ids", "attention_mask", "mm_token_type_ids")  # token types: from the ids (MRope)
        vision = {k: v.to(self.device) for k, v in batch.items() if k not in text_keys}
        return batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device), vision

    @torch.no_grad()
    def generate(self, prompts: list[str], generators: list[torch.Generator] | None,
                 images: list | None = None) -> Completions:  # fmt: skip
        """Completions of `prompts` (with `images`: a VLM's, one or None per prompt) drawn with `generators` (one per
        prompt; None: greedy), with a KV cache."""
        from transformers import DynamicCache

        settings = self.settings
        prompt_ids, prompt_mask, vision = self.encode(prompts, images)
        first_step = vision  # the image inputs enter the first forward only (the cache holds them after)
        rows = prompt_ids.shape[0]
        pad = self.tokenizer.pad_token_id
        ends = torch.tensor(self.end_ids, device=self.device)
        cache, mask = DynamicCache(), prompt_mask
        step_ids, step_positions = prompt_ids, self.positions(prompt_ids, prompt_mask, vision)
        tokens, logps, live = [], [], torch.ones(rows, dtype=torch.bool, device=self.device)
        alive_masks = []
        for _ in range(settings.max_new_tokens):
            out = self.trainable(input_ids=step_ids, attention_mask=mask, position_ids=step_positions,
                                 use_cache=True, **{self._cache_key: cache}, **first_step)  # fmt: skip
            first_step = {}
            cache = out[self._cache_key]
            logits = self._support(out.logits[:, -1].float() / settings.temperature)
            logp_all = torch.log_softmax(logits, -1)
            token = torch.where(live, self._draw(logits, generators), torch.full_like(live, pad, dtype=torch.long))
            tokens.append(token)
            logps.append(torch.where(live, logp_all.gather(-1, token[:, None])[:, 0], 0.0))
            alive_masks.append(live.clone())
            live = live & ~torch.isin(token, ends)
            if settings.stop:
                live = live & ~self._stopped(torch.stack(tokens, 1))
            if not live.any():
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            step_ids, step_positions = token[:, None], step_positions[..., -1:] + 1  # [B, 1] or M-RoPE's [3, B, 1]
        ids, completion_mask = torch.stack(tokens, 1), torch.stack(alive_masks, 1).long()
        texts = self.tokenizer.batch_decode(ids.masked_fill(completion_mask == 0, pad), skip_special_tokens=True)
        return Completions(prompt_ids, prompt_mask, ids, completion_mask, torch.stack(logps, 1), texts,
                           live.tolist(), vision, [image is not None for image in images or [None] * rows],
                           pad)  # fmt: skip

    def positions(self, ids: torch.Tensor, mask: torch.Tensor, vision: dict) -> torch.Tensor:
        """Position ids of `ids` (left-padded, `mask`): [B, L], or a Qwen-VL model's [3, B, L] (vision.py)."""
        return self.mrope(ids, mask, vision) if self.mrope is not None else positions(mask)

    def _draw(self, logits: torch.Tensor, generators: list[torch.Generator] | None) -> torch.Tensor:
        """Each row's next token: the most likely without `generators`, else drawn from its top-p nucleus with the
        row's own generator."""
        if generators is None:
            return logits.argmax(-1)
        probs = nucleus(logits, self.settings.top_p).softmax(-1).cpu()
        return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in
                          zip(probs, generators, strict=True)]).to(self.device)  # fmt: skip

    def _support(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits` with the blocked tokens (a VLM's placeholders) at -inf."""
        return logits.index_fill(-1, self.blocked, float("-inf")) if len(self.blocked) else logits

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
        whole, vision = torch.cat([prompt_ids, ids], 1), completions.vision_of(index)
        logits = self.trainable(input_ids=whole, attention_mask=mask, position_ids=self.positions(whole, mask, vision),
                                use_cache=False, **vision).logits  # fmt: skip
        logits = self._support(logits[:, prompt_ids.shape[1] - 1 : -1].float() / self.settings.temperature)
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, ids[..., None])[..., 0]
        if not entropy:
            return logp
        with torch.no_grad():
            return logp, -(logp_all.exp() * logp_all).sum(-1)

    def reference(self):
        """A context in which `token_logp` is the reference policy's: the model with its LoRA adapter disabled (a KL
        term with full fine-tuning is refused on loading the recipe)."""
        return self.trainable.disable_adapter()
