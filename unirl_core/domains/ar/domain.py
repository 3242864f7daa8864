"""The autoregressive domain on the `Domain` contract: a causal LM's completions of the prompts (what text rewards
score), trained by a token algorithm; evaluation completions; text grids; exports `from_pretrained` loads."""

from __future__ import annotations

from typing import ClassVar

import torch

from unirl_core.domains.ar.config import ARDomainConfig
from unirl_core.domains.base import Domain, DomainConfig


class ARRollout:
    """A rollout the worker keeps for `stack.train`: the samples, their completions, the texts the rewards score,
    and the domain's own reward terms (`reward_terms`: DAPO's overlong shaping), added to the total as they are."""

    def __init__(self, samples: list, completions, settings):
        self.samples, self.completions = samples, completions
        self.outputs = completions.texts
        self.reward_terms = {}
        if settings.overlong_buffer:
            lengths = completions.lengths.tolist()
            self.reward_terms["overlong"] = overlong_terms(lengths, settings.max_new_tokens, settings.overlong_buffer,
                                                           settings.overlong_penalty)  # fmt: skip

    def extend(self, other: ARRollout) -> ARRollout:
        """This rollout then `other` (dynamic sampling's later rollouts of the same step), for one `stack.train`."""
        joined = object.__new__(ARRollout)
        joined.samples, joined.completions = (
            self.samples + other.samples,
            self.completions.extend(other.completions),
        )
        joined.outputs = self.outputs + other.outputs
        joined.reward_terms = {k: v + other.reward_terms[k] for k, v in self.reward_terms.items()}
        return joined


def overlong_terms(lengths: list[int], max_new_tokens: int, buffer: int, penalty: float) -> list[float]:
    """DAPO's soft overlong punishment: 0 up to max_new_tokens - buffer tokens, then falling linearly to -penalty
    at max_new_tokens (veRL: min(-(length - expected) / buffer x penalty, 0))."""
    expected = max_new_tokens - buffer
    return [min(-(length - expected) / buffer * penalty, 0.0) for length in lengths]


class ARDomain(Domain):
    config_class: ClassVar[type[DomainConfig]] = ARDomainConfig
    outputs: ClassVar[str | None] = "text"

    def __init__(self, config, device):
        super().__init__(config, device)
        self._loaded: dict = {}  # condition image uri -> the image (a VLM's prompts)

    # --- rank side --------------------------------------------------------------------------------------------

    def build_policy(self):
        from unirl_core.domains.ar.policy import LMPolicy

        return LMPolicy(self.config, self.device)

    def rl_stack(self, policy):
        from unirl_core.domains.ar.stack import TokenStack

        config = self.config
        return TokenStack(policy, config.algorithm, total_updates=config.steps * config.algorithm.num_updates_per_batch,
                          gather=not config.fsdp.reshard_after_forward)  # fmt: skip

    def rollout(self, policy, stack, samples: list, step: int) -> ARRollout:
        """Completions of `samples`, sample i's draws from its own generator seeded by (seed, step, sample id)."""
        from unirl_core.data.noise import sample_seed

        seed = self.config.sampling.seed
        generators = [torch.Generator().manual_seed(sample_seed(seed, f"{step}:{s.sample_id}")) for s in samples]
        completions = policy.generate([s.example.prompt for s in samples], generators, self._images(samples))
        return ARRollout(samples, completions, self.config.domain)

    def _images(self, samples: list) -> list | None:
        """Each sample's condition image (`media_refs` role `condition`) or None; None when no sample has one. Each
        uri is loaded once per process, as a rollout's condition images are (guarded like an ingest download)."""
        from unirl_core.domains.diffusion.rollout.conditions import condition_uri, load_condition_image

        uris = [condition_uri(s) for s in samples]
        if not any(uris):
            return None
        cache, size = self._loaded, self.config.domain.image_size
        for uri in set(uris) - set(cache) - {None}:
            cache[uri] = load_condition_image(uri, size, size)
        return [cache[uri] if uri else None for uri in uris]

    def evaluate(self, policy, stack, prompts: list[str], first_index: int, seed: int, steps: int | None = None,
                 guidance: float | None = None) -> list:  # fmt: skip
        """Greedy completions (`train.domain.eval_mode: sample`: drawn from (seed, prompt index))."""
        from unirl_core.data.noise import sample_seed

        generators = None
        if self.config.domain.eval_mode == "sample":
            generators = [torch.Generator().manual_seed(sample_seed(seed, f"eval:{first_index + i}"))
                          for i in range(len(prompts))]  # fmt: skip
        return policy.generate(prompts, generators).texts

    # --- controller side --------------------------------------------------------------------------------------

    @classmethod
    def config_problems(cls, config):
        from unirl_core.algorithms.registry import algorithm_class

        yield from super().config_problems(config)
        name = config.algorithm.name
        if "ar" not in algorithm_class(name).domains:
            yield ("algorithm.name", name, "a token algorithm of the autoregressive domain: token_grpo, dapo, dr_grpo "
                   "or gspo")  # fmt: skip
        settings = config.domain
        if settings.overlong_buffer is not None and settings.overlong_buffer >= settings.max_new_tokens:
            yield ("domain.overlong_buffer", settings.overlong_buffer, f"fewer than domain.max_new_tokens "
                   f"({settings.max_new_tokens}): the tokens before the limit where the penalty grows")  # fmt: skip
        if settings.overlong_buffer is not None and config.reward.normalize != "total":
            yield ("reward.normalize", config.reward.normalize, "total with domain.overlong_buffer: the overlong "
                   "term adds to the total, which per-reward normalization does not read")  # fmt: skip
        if config.algorithm.beta > 0 and config.model.lora is None:
            yield ("algorithm.beta", config.algorithm.beta, "0 with full fine-tuning (model.lora: null), or train "
                   "with LoRA: the reference policy is the model with its adapter disabled")  # fmt: skip

    @classmethod
    def start_problems(cls, config) -> list[str]:
        """A model folder that is not a transformers causal LM with its tokenizer (config.json, tokenizer files)."""
        from pathlib import Path

        path = config.model.path
        if path.startswith("tiny:"):
            from unirl_core.models.tiny_lm import TINY_LMS

            name = path.split(":", 1)[1]
            return [] if name in TINY_LMS else [f"train.model.path: {path!r}: the ar domain's tiny models are "
                                                f"{', '.join(f'tiny:{n}' for n in TINY_LMS)}"]  # fmt: skip
        folder = Path(path).expanduser()
        if not folder.is_dir():
            return [f"train.model.path: {path!r} is not a folder; give the local folder of a transformers causal LM "
                    "(config.json, weights, tokenizer files)"]  # fmt: skip
        missing = [n for n in ("config.json",) if not (folder / n).is_file()]
        if not any((folder / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
            missing.append("tokenizer.json or tokenizer_config.json")
        return [f"train.model.path: {path} has no {', '.join(missing)}; give the folder of a transformers causal LM "
                "saved with save_pretrained (model and tokenizer)"] if missing else []  # fmt: skip

    @classmethod
    def title(cls, config) -> str:
        return f"causal LM ({config.model.path})"

    @classmethod
    def grid(cls, outputs: list, captions: list[str], cols: int):
        """The completions as text cells (a row per caption)."""
        import textwrap

        from PIL import Image, ImageDraw

        from unirl_core.worker.images import captioned_grid

        texts = ["\n".join(textwrap.wrap(output.replace("\n", " / "), 40)[:9]) or "(empty)" for output in outputs]
        height = 12 + 12 * max(text.count("\n") + 1 for text in texts)  # every cell as tall as the longest
        cells = []
        for text in texts:
            cell = Image.new("RGB", (256, height), "white")
            ImageDraw.Draw(cell).multiline_text((4, 4), text, fill="black")
            cells.append(cell)
        return captioned_grid(cells, captions, cols=cols)

    @classmethod
    def export(cls, policy, config, folder, merged: bool) -> bool:
        """A peft adapter folder (with the tokenizer), or the merged model (`merged`, or full fine-tuning):
        `AutoModelForCausalLM.from_pretrained(folder)` loads it (the adapter through peft)."""
        model = policy.trainable
        if policy.has_lora and merged:
            model = model.merge_and_unload()
        model.save_pretrained(folder, safe_serialization=True)
        policy.tokenizer.save_pretrained(folder)
        return merged or not policy.has_lora

    @classmethod
    def model_card(cls, config, run_name: str):
        from unirl_core.tracking.model_card import ModelCard

        fmt = "peft-lora-adapter" if config.model.lora else "transformers-causal-lm"
        return ModelCard(run_name=run_name, family="causal_lm", base_model=config.model.path,
                         algorithm=config.algorithm.name, steps=config.steps, warmup_steps=0, height=0, width=0,
                         format=fmt, load_with="transformers: AutoModelForCausalLM.from_pretrained(<this folder>)"
                         + (" after peft's PeftModel" if config.model.lora else ""))  # fmt: skip
