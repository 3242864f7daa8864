"""Every reward name a recipe can use, and the factory that builds the configured ones.

| name          | kind         | configured by                    | file          |
|---------------|--------------|----------------------------------|---------------|
| (weight-free) | image stats  | nothing                          | functions.py  |
| clip_score    | CLIP model   | `reward.clip`                    | clip.py       |
| aesthetic     | CLIP + head  | `reward.aesthetic`               | aesthetic.py  |
| <any key>     | HTTP server  | `reward.remote.<key>`            | remote.py     |

Only the rewards a recipe weights or guards are built; a configured but unused one is skipped with a warning.
Heavy imports (torch, transformers) happen inside the factories.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from unirl_core.rewards.names import MODEL_REWARDS

if TYPE_CHECKING:
    from unirl_core.config.schema import RewardConfig

logger = logging.getLogger(__name__)

# A reward as the service calls it: one float per image.
Scorer = Callable[[Sequence[Image.Image], Sequence[str], Sequence[str]], np.ndarray]


def _clip_score(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.clip import ClipScore

    return ClipScore(config.clip.model_path, device, config.clip.batch_size)


def _aesthetic(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.aesthetic import AestheticScore

    settings = config.aesthetic
    return AestheticScore(settings.clip_model_path, settings.head_path, device, settings.batch_size)


_FACTORIES: dict[str, Callable[[RewardConfig, str], Scorer]] = {"clip_score": _clip_score, "aesthetic": _aesthetic}


def build_scorers(config: RewardConfig, device: str = "cpu") -> dict[str, Scorer]:
    """The model and remote rewards `config` weights or guards, by name, loaded on `device`."""
    from unirl_core.rewards.remote import RemoteScorer

    problems = [f"{path}: got {value!r}; {message}" for path, value, message in config.problems()]
    if problems:
        raise ValueError("reward config: " + "; ".join(problems))
    used = set(config.weights) | set(config.guards)
    scorers: dict[str, Scorer] = {}
    for name, section in MODEL_REWARDS.items():
        if name in used:
            scorers[name] = _FACTORIES[name](config, device)
        elif getattr(config, section) is not None:
            logger.warning("reward.%s is set but %s is neither weighted nor a guard: not loaded", section, name)
    for name, remote in config.remote.items():
        if name in used:
            scorers[name] = RemoteScorer.from_config(remote)
        else:
            logger.warning("reward.remote.%s is set but neither weighted nor a guard: not called", name)
    return scorers
