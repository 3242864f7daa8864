"""The toy token domain against the `Domain` contract alone (unirl_core/domains/base.py).

| contract part  | here                                                                                        |
|----------------|---------------------------------------------------------------------------------------------|
| policy         | `GPT2LMHeadModel` from a shrunk `GPT2Config` (no download), fully fine-tuned, FSDP2 per block |
| rollout        | `new_tokens` sampled tokens per prompt, each draw from the sample's own generator           |
|                | (seed, step, sample id): the same tokens on any number of workers; their log-probs kept     |
| outputs        | the tokens as text ("3 1 3 5"), scored by reward functions (`count_target`)                 |
| train step     | GRPO's clipped surrogate per token, averaged; one AdamW step, gradients clipped              |
| evaluate       | greedy tokens                                                                               |
| grid / export  | text rows drawn on an image / `save_pretrained` (GPT2LMHeadModel.from_pretrained loads it)  |
"""

from __future__ import annotations

import contextlib
from typing import Annotated, ClassVar

import numpy as np
import torch
from pydantic import Field

from unirl_core.data.noise import sample_seed
from unirl_core.domains.base import Domain, DomainConfig
from unirl_core.worker.optim import adamw, clip_gradients

PROMPT_TOKENS = 4  # a prompt is its first 4 characters, one token each
TARGET = 3  # the token `count_target` rewards


class TokenDomainConfig(DomainConfig):
    vocab_size: Annotated[int, Field(ge=4)] = 8
    """Tokens 0..vocab_size-1 (0 pads prompts)."""

    hidden: Annotated[int, Field(ge=4)] = 32
    """The GPT-2's width (2 layers, 2 heads)."""

    new_tokens: Annotated[int, Field(ge=1)] = 6
    """Tokens generated per sample."""

    temperature: Annotated[float, Field(gt=0)] = 1.0
    """Sampling temperature of rollouts (evaluation is greedy)."""


def count_target(outputs, prompts) -> np.ndarray:
    """The reward: the fraction of an output's tokens that are TARGET."""
    return np.array([output.split().count(str(TARGET)) / len(output.split()) for output in outputs])


def encode(prompts: list[str], vocab_size: int, device) -> torch.Tensor:
    """[B, PROMPT_TOKENS] token ids: each of the first characters mapped to 1..vocab_size-1, padded with 0."""
    rows = [[ord(c) % (vocab_size - 1) + 1 for c in prompt[:PROMPT_TOKENS]] for prompt in prompts]
    return torch.tensor([row + [0] * (PROMPT_TOKENS - len(row)) for row in rows], device=device)


class TokenPolicy:
    """The policy the worker shards and checkpoints: `trainable`, `blocks()`, `dtype`, `parameters()`."""

    dtype = torch.float32

    def __init__(self, settings: TokenDomainConfig, device):
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=settings.vocab_size, n_positions=PROMPT_TOKENS + settings.new_tokens,
                            n_embd=settings.hidden, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, tie_word_embeddings=False)  # fmt: skip
        self.trainable = GPT2LMHeadModel(config).to(device)
        self.device = device

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.trainable.transformer.h)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.trainable.parameters() if p.requires_grad]

    def token_logp(self, ids: torch.Tensor, first: int) -> torch.Tensor:
        """[B, L - first] float32 log-probs of ids[:, first:] given what precedes each."""
        logits = self.trainable(ids).logits[:, first - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[:, first:, None])[..., 0]

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, new_tokens: int, temperature: float, generators=None):
        """(tokens [B, new_tokens], their log-probs [B, new_tokens]); greedy without `generators`."""
        ids, logps = prompt_ids, []
        for _ in range(new_tokens):
            logp = torch.log_softmax(self.trainable(ids).logits[:, -1].float() / temperature, -1)
            if generators is None:
                token = logp.argmax(-1)
            else:
                token = torch.cat([torch.multinomial(row.exp().cpu(), 1, generator=g) for row, g in
                                   zip(logp, generators, strict=True)]).to(ids.device)  # fmt: skip
            logps.append(logp.gather(-1, token[:, None])[:, 0])
            ids = torch.cat([ids, token[:, None]], 1)
        return ids[:, prompt_ids.shape[1] :], torch.stack(logps, 1)


class TokenRollout:
    def __init__(self, samples, prompt_ids, tokens, logp_old):
        self.samples, self.prompt_ids, self.tokens, self.logp_old = samples, prompt_ids, tokens, logp_old
        self.outputs = [" ".join(str(t) for t in row) for row in tokens.tolist()]


class TokenGRPOStack:
    """One AdamW step per batch on GRPO's clipped surrogate, token-mean then batch-mean."""

    def __init__(self, policy: TokenPolicy, algorithm):
        self.policy, self.algorithm = policy, algorithm
        self.optimizer = adamw(policy.parameters(), algorithm.learning_rate)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0)

    def rollout_policy(self):
        return contextlib.nullcontext()

    def states(self) -> dict:
        return {}

    def train(self, rollout: TokenRollout, advantages_B: torch.Tensor, step: int) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        ids = torch.cat([rollout.prompt_ids, rollout.tokens], 1)
        logp = self.policy.token_logp(ids, rollout.prompt_ids.shape[1])
        ratio = torch.exp(logp - rollout.logp_old)
        clip, advantages = self.algorithm.clip_range, advantages_B[:, None]
        loss = -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
        loss.backward()
        grad_norm = clip_gradients(self.policy.parameters(), self.algorithm.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        return {"loss": loss.item(), "grad_norm": grad_norm.item(), "ratio_mean": ratio.mean().item(), "lr": lr,
                "target_logp": logp.detach()[rollout.tokens == TARGET].mean().nan_to_num().item()}  # fmt: skip


class TokenDomain(Domain):
    config_class: ClassVar[type[DomainConfig]] = TokenDomainConfig

    def build_policy(self) -> TokenPolicy:
        return TokenPolicy(self.config.domain, self.device)

    def rl_stack(self, policy: TokenPolicy) -> TokenGRPOStack:
        return TokenGRPOStack(policy, self.config.algorithm)

    def rollout(self, policy: TokenPolicy, stack, samples: list, step: int) -> TokenRollout:
        settings, seed = self.config.domain, self.config.sampling.seed
        prompt_ids = encode([s.example.prompt for s in samples], settings.vocab_size, self.device)
        generators = [torch.Generator().manual_seed(sample_seed(seed, f"{step}:{s.sample_id}")) for s in samples]
        tokens, logp = policy.generate(prompt_ids, settings.new_tokens, settings.temperature, generators)
        return TokenRollout(samples, prompt_ids, tokens, logp)

    def evaluate(self, policy: TokenPolicy, stack, prompts: list[str], first_index: int, seed: int) -> list:
        settings = self.config.domain
        tokens, _ = policy.generate(encode(prompts, settings.vocab_size, self.device), settings.new_tokens, 1.0)
        return [" ".join(str(t) for t in row) for row in tokens.tolist()]

    @classmethod
    def config_problems(cls, config):
        yield from super().config_problems(config)
        if config.algorithm.name != "grpo":
            yield "algorithm.name", config.algorithm.name, "grpo: the toy token domain trains GRPO's clipped objective"
        if config.model.lora is not None:
            yield "model.lora", "set", "null: the toy token domain fine-tunes its whole model"
        for name in [*config.reward.weights, *config.reward.guards]:
            if ":" not in name:
                yield f"reward.weights.{name}", name, "a text reward function as 'package.module:function'"

    @classmethod
    def grid(cls, outputs: list, captions: list[str], cols: int):
        from PIL import Image, ImageDraw

        from unirl_core.worker.images import captioned_grid

        cells = []
        for output in outputs:
            cell = Image.new("RGB", (96, 16), "white")
            ImageDraw.Draw(cell).text((2, 2), output, fill="black")
            cells.append(cell)
        return captioned_grid(cells, captions, cols=cols)

    @classmethod
    def export(cls, policy: TokenPolicy, config, folder, merged: bool) -> bool:
        policy.trainable.save_pretrained(folder)
        return True

    @classmethod
    def model_card(cls, config, run_name: str):
        from unirl_core.tracking.model_card import ModelCard

        return ModelCard(run_name=run_name, family="toy_tokens", base_model="tiny GPT-2 (built)",
                         algorithm=config.algorithm.name, steps=config.steps, warmup_steps=0, height=0, width=0,
                         format="transformers-causal-lm",
                         load_with="transformers: GPT2LMHeadModel.from_pretrained(<this folder>)")  # fmt: skip
