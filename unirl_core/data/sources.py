"""Prompt data sources: what the controller draws one rollout's prompts from.

A source yields batches of `prompts_per_rollout` distinct prompts forever (epoch after epoch) and has
`state_dict()` / `load_state_dict()`, so a resumed run draws exactly the batches the uninterrupted run would have.

| key     | class             | when                                                                       |
|---------|-------------------|----------------------------------------------------------------------------|
| `file`  | FilePromptSource  | real runs: reads `data_path`, shuffles each epoch, drops the last partial batch |
| `smoke` | SmokePromptSource | smoke checks: ignores `data_path`, cycles a few built-in prompts           |

A dotted class path (`mypkg.sources.MySource`) selects any class with the same constructor and methods.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from unirl_core.data.prompts import PromptExample, load_prompts

logger = logging.getLogger(__name__)


class PromptSource(Protocol):
    prompts_per_rollout: int

    def next_batch(self) -> list[PromptExample]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class FilePromptSource:
    """Prompts from a file; epoch e visits them in the permutation drawn from (seed, e); partial batches dropped."""

    def __init__(
        self,
        data_path: str | None,
        prompts_per_rollout: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        prompt_key: str = "prompt",
    ):
        if not data_path:
            raise ValueError("the file prompt source needs train.data.data_path (a .txt, .jsonl or .json file)")
        self.data_path = data_path
        self.prompts = load_prompts(data_path, prompt_key=prompt_key)
        self.prompts_per_rollout = prompts_per_rollout
        self.shuffle = shuffle
        self.seed = seed
        if len(self.prompts) < prompts_per_rollout:
            raise ValueError(
                f"{data_path} has {len(self.prompts)} prompts, fewer than train.data.prompts_per_rollout="
                f"{prompts_per_rollout}: add prompts or lower prompts_per_rollout"
            )
        self.epoch = 0
        self.batch_in_epoch = 0
        self._order = self._epoch_order(0)

    @property
    def batches_per_epoch(self) -> int:
        return len(self.prompts) // self.prompts_per_rollout  # the last partial batch is dropped

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.prompts))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.prompts))

    def next_batch(self) -> list[PromptExample]:
        if self.batch_in_epoch == self.batches_per_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        start = self.batch_in_epoch * self.prompts_per_rollout
        self.batch_in_epoch += 1
        return [self.prompts[i] for i in self._order[start : start + self.prompts_per_rollout]]

    def __iter__(self) -> Iterator[list[PromptExample]]:
        while True:
            yield self.next_batch()

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for example in self.prompts:
            digest.update(f"{example.prompt_id}\x00{example.prompt}\x00".encode())
        return digest.hexdigest()[:16]

    def state_dict(self) -> dict[str, Any]:
        return {
            "source": "file",
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "num_prompts": len(self.prompts),
            "prompts_fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("prompts_fingerprint") != self.fingerprint():
            raise ValueError(
                f"{self.data_path} changed since this state was saved ({state.get('num_prompts')} prompts then, "
                f"{len(self.prompts)} now; fingerprint {state.get('prompts_fingerprint')} vs {self.fingerprint()}): "
                "resume with the original prompt file, or start a new run"
            )
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        self._order = self._epoch_order(self.epoch)


SMOKE_PROMPTS = (
    "a red circle on a white background",
    "a blue square in the middle of a green field",
    "a yellow triangle above a calm sea",
    "black and white vertical stripes",
    "a soft orange gradient at sunset",
    "a purple star on a dark night sky",
    "a checkerboard of cyan and magenta tiles",
    "a small house with a red roof under a blue sky",
)


class SmokePromptSource:
    """A few built-in prompts, cycled in order. For smoke checks: `data_path` is ignored."""

    def __init__(self, data_path: str | None = None, prompts_per_rollout: int = 4, **ignored: Any):
        if data_path:
            logger.warning("the smoke prompt source ignores train.data.data_path=%s", data_path)
        self.prompts = [PromptExample(prompt=p, prompt_id=f"smoke:{i}") for i, p in enumerate(SMOKE_PROMPTS)]
        self.prompts_per_rollout = prompts_per_rollout
        self.position = 0

    def next_batch(self) -> list[PromptExample]:
        n = len(self.prompts)
        batch = [self.prompts[(self.position + i) % n] for i in range(self.prompts_per_rollout)]
        self.position = (self.position + self.prompts_per_rollout) % n
        return batch

    def __iter__(self) -> Iterator[list[PromptExample]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {"source": "smoke", "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


SOURCES: dict[str, type] = {"file": FilePromptSource, "smoke": SmokePromptSource}


def build_source(data_config) -> PromptSource:
    """The source a `train.data` config selects: a registered key or a dotted class path."""
    key = data_config.source
    if key in SOURCES:
        cls = SOURCES[key]
    else:
        module_name, _, class_name = key.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ValueError(
                f"train.data.source={key!r}: not a registered source ({', '.join(SOURCES)}) and not an "
                f"importable class path ({exc})"
            ) from None
    return cls(
        data_config.data_path,
        data_config.prompts_per_rollout,
        shuffle=data_config.shuffle,
        seed=data_config.seed,
        prompt_key=data_config.prompt_key,
    )


def load_eval_prompts(data_config) -> list[PromptExample]:
    """Eval prompts (`train.data.eval_data_path`) in file order; none when no eval file is set."""
    if not data_config.eval_data_path:
        return []
    return load_prompts(data_config.eval_data_path, prompt_key=data_config.prompt_key)
