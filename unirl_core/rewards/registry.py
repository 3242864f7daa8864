"""Every reward name a recipe can use, and the factory that builds the configured ones.

| name          | kind         | configured by                    | file          |
|---------------|--------------|----------------------------------|---------------|
| (weight-free) | image stats  | nothing                          | functions.py  |
| (weight-free) | text checks  | the prompt record's metadata     | text.py       |
| clip_score    | CLIP model   | `reward.clip`                    | clip.py       |
| aesthetic     | CLIP + head  | `reward.aesthetic`               | aesthetic.py  |
| pickscore     | CLIP-H       | `reward.pickscore`               | clip.py       |
| hpsv2         | CLIP-H (HPS) | `reward.hpsv2`                   | hpsv2.py      |
| ocr           | TrOCR        | `reward.ocr`                     | ocr.py        |
| imagereward   | BLIP + MLP   | `reward.imagereward`             | imagereward.py|
| geneval       | OWLv2 + CLIP | `reward.geneval` + prompt metadata | geneval.py  |
| vlm_judge     | chat VLM     | `reward.vlm_judge`               | vlm_judge.py  |
| llm_judge     | chat LM      | `reward.llm_judge` (text outputs) | vlm_judge.py |
| (weight-free) | video motion | nothing (video outputs)          | video.py      |
| temporal_consistency | CLIP  | `reward.clip` (video outputs)    | video.py      |
| video_judge   | chat VLM     | `reward.video_judge` (video outputs) | vlm_judge.py |
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
from unirl_core.rewards.text import DESCRIPTIONS as TEXT_DESCRIPTIONS
from unirl_core.rewards.video import DESCRIPTIONS as VIDEO_DESCRIPTIONS

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


def _pickscore(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.clip import PickScore

    settings = config.pickscore
    return PickScore(settings.model_path, settings.processor_path, device, settings.batch_size)


def _hpsv2(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.hpsv2 import HPSv2Score

    s = config.hpsv2
    return HPSv2Score(s.checkpoint_path, s.tokenizer_path, s.arch, device, s.batch_size)


def _ocr(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.ocr import OcrScore

    settings = config.ocr
    return OcrScore(settings.model_path, device, settings.batch_size, settings.max_new_tokens)


def _imagereward(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.imagereward import ImageRewardScore

    settings = config.imagereward
    return ImageRewardScore(
        settings.checkpoint_path, settings.tokenizer_path, device, settings.batch_size, settings.arch_path
    )


def _geneval(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.geneval import GenEvalScore

    s = config.geneval
    return GenEvalScore(s.detector_path, s.clip_path, device, s.batch_size, s.threshold, s.scoring)


def _vlm_judge(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.vlm_judge import VlmJudgeScore

    return VlmJudgeScore(device=device, **config.vlm_judge.model_dump())


def _video_judge(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.vlm_judge import VideoJudgeScore

    return VideoJudgeScore(device=device, **config.video_judge.model_dump())


def _temporal_consistency(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.video import TemporalConsistency

    return TemporalConsistency(config.clip.model_path, device, config.clip.batch_size)


def _llm_judge(config: RewardConfig, device: str) -> Scorer:
    from unirl_core.rewards.vlm_judge import LlmJudgeScore

    return LlmJudgeScore(device=device, **config.llm_judge.model_dump())


_FACTORIES: dict[str, Callable[[RewardConfig, str], Scorer]] = {
    "clip_score": _clip_score, "aesthetic": _aesthetic, "pickscore": _pickscore, "hpsv2": _hpsv2, "ocr": _ocr,
    "imagereward": _imagereward, "geneval": _geneval, "vlm_judge": _vlm_judge, "llm_judge": _llm_judge,
    "temporal_consistency": _temporal_consistency,
    "video_judge": _video_judge,
}  # fmt: skip


# name -> (what it scores, what it needs): `unirl rewards list`
DESCRIPTIONS: dict[str, tuple[str, str]] = {
    "jpeg_compressibility": ("-(JPEG quality-95 size in kB) (DDPO's)", "nothing"),
    "jpeg_incompressibility": ("+(JPEG quality-95 size in kB)", "nothing"),
    "brightness": ("mean luma in [0, 1]", "nothing"),
    "dark_fraction": ("fraction of pixels with luma < 0.1", "nothing"),
    "edge_density": ("fraction of pixels whose luma gradient exceeds 0.1", "nothing"),
    "colour_entropy": ("entropy (bits) of the 4-bit-per-channel colour histogram", "nothing"),
    "clip_score": ("100 x cosine(CLIP image, CLIP prompt)", "reward.clip.model_path: a CLIP folder"),
    "aesthetic": ("LAION's aesthetic head on CLIP ViT-L/14", "reward.aesthetic.{clip_model_path, head_path}"),
    "pickscore": (
        "PickScore: exp(logit_scale) x cosine (about 18-23)",
        "reward.pickscore.{model_path, processor_path}: PickScore_v1 + the CLIP-H processor",
    ),
    "hpsv2": (
        "HPSv2/HPSv2.1: cosine(HPS image, HPS prompt), about 0.2-0.35",
        "reward.hpsv2.{checkpoint_path, tokenizer_path}: HPS_v2.1_compressed.pt + the CLIP-H tokenizer",
    ),
    "ocr": (
        "text accuracy in [0, 1] of the prompt's quoted text, read by OCR (Flow-GRPO's)",
        "reward.ocr.model_path: a TrOCR-style VisionEncoderDecoderModel folder",
    ),
    "imagereward": (
        "ImageReward: BLIP human-preference score, normalized (about zero-mean, unit-variance)",
        "reward.imagereward.{checkpoint_path, tokenizer_path}: ImageReward.pt + a bert-base-uncased tokenizer",
    ),
    "geneval": (
        "GenEval checks (objects, counts, colours, positions): mean credit <= 1 (flow_grpo's) or strict 0/1",
        "reward.geneval.{detector_path, clip_path}: OWLv2 + CLIP; each prompt's GenEval record as its metadata",
    ),
    "vlm_judge": (
        "a VLM's P(yes) (or expected 1-9 digit) from its answer-token probabilities",
        "reward.vlm_judge.model_path: a local chat VLM folder (e.g. Qwen2.5-VL-7B-Instruct)",
    ),
    "llm_judge": (
        "text: a chat LM's P(yes) (or expected 1-9 digit) about each (prompt, response)",
        "reward.llm_judge.model_path: a local chat LM folder (e.g. Qwen3-8B)",
    ),
}


DESCRIPTIONS |= TEXT_DESCRIPTIONS | VIDEO_DESCRIPTIONS


def used_model_rewards(config: RewardConfig) -> list[str]:
    """The model rewards `config` weights or guards (those `placement: dedicated` serves from reward actors)."""
    used = set(config.weights) | set(config.guards)
    return [name for name in MODEL_REWARDS if name in used]


def build_scorers(config: RewardConfig, device: str = "cpu", skip: set[str] = frozenset()) -> dict[str, Scorer]:
    """The model and remote rewards `config` weights or guards, by name, loaded on `device`; `skip`: names
    scored elsewhere (by the dedicated reward actors; a reward actor skips everything it does not serve)."""
    from unirl_core.rewards.remote import RemoteScorer

    problems = [f"{path}: got {value!r}; {message}" for path, value, message in config.problems()]
    if problems:
        raise ValueError("reward config: " + "; ".join(problems))
    used = set(config.weights) | set(config.guards)
    scorers: dict[str, Scorer] = {}
    for name, section in MODEL_REWARDS.items():
        if name in skip:
            continue
        if name in used:
            try:
                scorers[name] = _FACTORIES[name](config, device)
            except (OSError, ValueError) as exc:  # a missing or wrong folder: name the recipe key that gave it
                raise type(exc)(f"train.reward.{section}: {exc}") from None
        elif getattr(config, section) is not None and not any(MODEL_REWARDS.get(u) == section for u in used):
            logger.warning("reward.%s is set but %s is neither weighted nor a guard: not loaded", section, name)
    for name, remote in config.remote.items():
        if name in skip:
            continue
        if name in used:
            scorers[name] = RemoteScorer.from_config(remote)
        else:
            logger.warning("reward.remote.%s is set but neither weighted nor a guard: not called", name)
    return scorers
