"""Prompt data sources: what the controller draws one rollout's prompts from.

A source yields batches of `prompts_per_rollout` distinct prompts forever (epoch after epoch) and has
`state_dict()` / `load_state_dict()`, so a resumed run draws exactly the batches the uninterrupted run would have.

| key     | class             | when                                                                       |
|---------|-------------------|----------------------------------------------------------------------------|
| `file`  | FilePromptSource  | real runs: reads `data_path`, shuffles each epoch, drops the last partial batch |
| `smoke` | SmokePromptSource | smoke checks: ignores `data_path`, the same batching over 8 built-in prompts |
| `arithmetic` | ArithmeticPromptSource | the autoregressive demo: 55 one-digit sums with their answers in `metadata` |
| `counting` | CountingPromptSource | the VLM demo: 16 pictures of 1-4 dots, "How many dots?", the count in `metadata` |

A dotted class path (`mypkg.sources.MySource`) selects any class with the same constructor and methods.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from unirl_core.data.prompts import PromptExample, load_prompts
from unirl_core.data.resume import EpochCursor
from unirl_core.io import storage

logger = logging.getLogger(__name__)


class PromptSource(Protocol):
    prompts_per_rollout: int

    def next_batch(self) -> list[PromptExample]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class PromptListSource(EpochCursor):
    """Batches of distinct prompts from a list; epoch e visits them in the permutation drawn from (seed, e) and
    drops the last partial batch."""

    kind = "list"

    def __init__(
        self, prompts: list[PromptExample], prompts_per_rollout: int, *, shuffle: bool, seed: int, origin: str
    ):
        if len(prompts) < prompts_per_rollout:
            raise ValueError(
                f"{origin} has {len(prompts)} prompts, fewer than train.data.prompts_per_rollout="
                f"{prompts_per_rollout}: add prompts or lower prompts_per_rollout"
            )
        self.prompts = prompts
        self.prompts_per_rollout = prompts_per_rollout
        self.shuffle = shuffle
        self.seed = seed
        self.origin = origin
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

    def _settings(self) -> dict[str, Any]:
        return {
            "source": self.kind,
            "prompts_per_rollout": self.prompts_per_rollout,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_prompts": len(self.prompts),
            "prompts_fingerprint": self.fingerprint(),
        }

    def _resume_error(self, details: str) -> str:
        return (
            f"{self.origin}: the prompt source changed since this state was saved ({details}); resume with the "
            "original prompts and train.data settings, or start a new run"
        )


class FilePromptSource(PromptListSource):
    """Prompts from `data_path` (.txt, .jsonl, .json; local or fsspec URL)."""

    kind = "file"

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
        try:
            version = storage.version(data_path)
        except FileNotFoundError:
            version = "missing"  # load_prompts names the file in its error
        prompts = _parsed_prompts(data_path, prompt_key, version)
        super().__init__(list(prompts), prompts_per_rollout, shuffle=shuffle, seed=seed, origin=data_path)


@functools.lru_cache(maxsize=8)
def _parsed_prompts(data_path: str, prompt_key: str, version: str) -> tuple[PromptExample, ...]:
    """A prompt file parsed once per process and version (validation, the inputs log and each round's controller
    build a source from it before the first step)."""
    return tuple(load_prompts(data_path, prompt_key=prompt_key))


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


class BuiltInPromptSource(PromptListSource):
    """Prompts built into unirl (`examples()`): `data_path` is ignored (with a warning)."""

    def __init__(
        self,
        data_path: str | None = None,
        prompts_per_rollout: int = 4,
        *,
        shuffle: bool = True,
        seed: int = 0,
        prompt_key: str = "prompt",
    ):
        if data_path:
            logger.warning("the %s prompt source ignores train.data.data_path=%s", self.kind, data_path)
        super().__init__(self.examples(), prompts_per_rollout, shuffle=shuffle, seed=seed,
                         origin=f"the {self.kind} source")  # fmt: skip

    @staticmethod
    def examples() -> list[PromptExample]:
        raise NotImplementedError


class SmokePromptSource(BuiltInPromptSource):
    """A few built-in prompts, for smoke checks."""

    kind = "smoke"

    @staticmethod
    def examples() -> list[PromptExample]:
        return [PromptExample(prompt=p, prompt_id=f"smoke:{i}") for i, p in enumerate(SMOKE_PROMPTS)]


class ArithmeticPromptSource(BuiltInPromptSource):
    """Sums of two digits whose answer is one digit ("3+4=", 55 prompts), each with its verifiable answer in
    `metadata` (`answer`, and `pattern` of a bare number): the autoregressive demo's task."""

    kind = "arithmetic"

    @staticmethod
    def examples() -> list[PromptExample]:
        pairs = [(a, b) for a in range(10) for b in range(10) if a + b <= 9]
        return [PromptExample(prompt=f"{a}+{b}=", prompt_id=f"arithmetic:{a}+{b}",
                              metadata={"answer": str(a + b), "pattern": r"\d+"}) for a, b in pairs]  # fmt: skip


class CountingPromptSource(BuiltInPromptSource):
    """Pictures of 1 to 4 black dots on white, 4 layouts per count (16 prompts "How many dots?"), each picture a
    condition image (`media_refs`) and its count the verifiable answer in `metadata`: the VLM demo's task. The
    pictures are drawn once into the workspace (`$UNIRL_HOME/data/builtin/counting`), each written atomically."""

    kind = "counting"

    @staticmethod
    def examples() -> list[PromptExample]:
        from unirl_core.data.prompts import MediaRef
        from unirl_core.workspace import workspace

        folder = workspace().data / "builtin" / "counting"
        examples = []
        for count in range(1, 5):
            for layout in range(4):
                path = folder / f"{count}-{layout}.png"
                if not path.is_file():
                    storage.write_bytes_atomic(str(path), dots_png(count, layout))
                examples.append(PromptExample(prompt="How many dots?", prompt_id=f"counting:{count}-{layout}",
                                              metadata={"answer": str(count), "pattern": r"\d+"},
                                              media_refs=(MediaRef("image", "condition", str(path)),)))  # fmt: skip
        return examples


def dots_png(count: int, layout: int, size: int = 56) -> bytes:
    """A PNG of `count` black 8 px dots on white, at cells of a 4 x 4 grid chosen by (count, layout)."""
    import io

    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), "white")
    draw, cell = ImageDraw.Draw(image), size // 4
    cells = np.random.default_rng(count * 10 + layout).choice(16, size=count, replace=False)
    for c in cells.tolist():
        x, y = (c % 4) * cell + cell // 2, (c // 4) * cell + cell // 2
        draw.ellipse((x - 4, y - 4, x + 4, y + 4), fill="black")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


SOURCES: dict[str, type] = {"file": FilePromptSource, "smoke": SmokePromptSource, "arithmetic": ArithmeticPromptSource,
                            "counting": CountingPromptSource}  # fmt: skip


def source_class(key: str) -> type:
    """The class a `train.data.source` value names: a registered key or an importable dotted class path."""
    if key in SOURCES:
        return SOURCES[key]
    module_name, _, class_name = key.rpartition(".")
    allowed = f"a registered source ({', '.join(SOURCES)}) or an importable dotted class path"
    if not module_name:
        raise ValueError(allowed)
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{allowed}; importing it failed: {exc}") from None
    if not (isinstance(found, type) and callable(getattr(found, "next_batch", None))):
        raise ValueError(f"{allowed}; {key} is not a class with next_batch(), state_dict() and load_state_dict()")
    return found


def build_source(data_config) -> PromptSource:
    """The source a `train.data` config selects: a registered key or a dotted class path."""
    cls = source_class(data_config.source)
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
