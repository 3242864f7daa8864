"""The reward service: scores a rollout with a weighted composite of named rewards, and fails loudly.

A NaN, infinite or missing score stops the step with the sample ids: a trainer must never learn from it.
Components are returned separately (for per-component metrics and guard statistics) with the weighted total.
Names come from registry.py: the weight-free rewards, `clip_score`, `aesthetic`, and each `remote` scorer's key; a
`package.module:function` name is a reward function of your own (outputs, prompts) -> one float per output.

Video outputs (`unirl_core.data.video.Video`): the image rewards and the remote scorers (whose contract sends
images) score frames and aggregate them per video (`train.reward.video`, rewards/video.py); video rewards and your
own functions receive the videos.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from unirl_core.data.video import Video, is_video
from unirl_core.rewards.errors import RewardError, ScorerUnavailableError
from unirl_core.rewards.functions import REWARDS
from unirl_core.rewards.names import is_plugin, modality, plugin_reward
from unirl_core.rewards.registry import Scorer, build_scorers
from unirl_core.rewards.text import TEXT_REWARDS
from unirl_core.rewards.video import VIDEO_REWARDS, score_per_frame

if TYPE_CHECKING:
    from unirl_core.config.schema import RewardConfig, VideoRewardConfig

__all__ = ["RewardError", "RewardService", "ScorerUnavailableError"]


def _ignoring_ids(reward):
    return lambda images, prompts, sample_ids: reward(images, prompts)


def _reading_metadata(reward):
    def scorer(outputs, prompts, sample_ids, metadata):
        return reward(outputs, prompts, metadata)

    scorer.wants_metadata = True
    return scorer


class RewardService:
    """`weights`: reward name -> weight in the total; `guards`: names scored and reported, weight 0.

    `scorers` adds rewards by name (model and remote rewards, built by `from_config`) to the weight-free ones.
    `video`: how image rewards score video outputs (default: the first frame); `per_frame`: names scored frame by
    frame on videos besides the image rewards (the remote scorers)."""

    def __init__(
        self,
        weights: Mapping[str, float],
        guards: Sequence[str] = (),
        scorers: Mapping[str, Scorer] | None = None,
        video: VideoRewardConfig | None = None,
        per_frame: Sequence[str] = (),
    ):
        available = {name: _ignoring_ids(fn) for name, fn in REWARDS.items()} | dict(scorers or {})
        available |= {name: _ignoring_ids(fn) for name, fn in VIDEO_REWARDS.items()}
        available |= {name: _reading_metadata(fn) for name, fn in TEXT_REWARDS.items()}
        available |= {name: _ignoring_ids(plugin_reward(name)) for name in [*weights, *guards] if is_plugin(name)}
        unknown = sorted((set(weights) | set(guards)) - set(available))
        if unknown:
            raise ValueError(f"unknown reward(s) {unknown}; registered: {sorted(available)}")
        if not weights:
            raise ValueError("at least one weighted reward is needed")
        self.weights, self.guards = dict(weights), [g for g in guards if g not in weights]
        self.scorers = {name: available[name] for name in [*self.weights, *self.guards]}
        self.per_frame = {name for name in self.scorers if modality(name) == "image"} | set(per_frame)
        self.frames, self.sample_frames = (video.frames, video.sample_frames) if video is not None else ("first", 4)

    @classmethod
    def from_config(
        cls, config: RewardConfig, device: str = "cpu", served: Mapping[str, Scorer] | None = None
    ) -> RewardService:
        """The service a recipe's `train.reward` describes; model rewards load on `device` (once per process),
        except those in `served` (name -> a scorer on the dedicated reward actors)."""
        served = dict(served or {})
        scorers = build_scorers(config, device, skip=set(served)) | served
        per_frame = [name for name, remote in config.remote.items() if remote.videos == "frames"]
        return cls(config.weights, config.guards, scorers, config.video, per_frame=per_frame)

    def score(
        self,
        images: Sequence[Image.Image] | Sequence[Video],
        prompts: Sequence[str],
        sample_ids: Sequence[str],
        metadata: Sequence[dict] | None = None,
        finite: bool = True,
    ) -> dict[str, np.ndarray]:
        """{"total": [B], each component: [B]}; RewardError names the samples of any bad score (`finite` false:
        NaN and infinities are kept, as an evaluation counts them). `metadata`: each prompt record's `metadata`
        (GenEval's checks), given to the scorers that read it (`wants_metadata`). Videos: one score per video."""
        components = {}
        videos = bool(images) and all(is_video(output) for output in images)
        for name, scorer in self.scorers.items():
            if videos and name in self.per_frame:
                scores = score_per_frame(scorer, images, prompts, sample_ids, metadata, self.frames, self.sample_frames)
            elif getattr(scorer, "wants_metadata", False):
                given = list(metadata) if metadata is not None else [{} for _ in images]
                scores = scorer(images, prompts, sample_ids, metadata=given)
            else:
                scores = scorer(images, prompts, sample_ids)
            scores = np.asarray(scores, dtype=np.float64)
            if scores.shape != (len(images),):
                raise RewardError(
                    f"reward {name} returned {scores.shape[0] if scores.ndim else 0} scores for {len(images)} samples"
                )
            bad = [sample_ids[i] for i in np.flatnonzero(~np.isfinite(scores))]
            if bad and finite:
                raise RewardError(f"reward {name} is NaN or infinite for samples {bad}: refusing to train on it")
            components[name] = scores
        components["total"] = sum(self.weights[name] * components[name] for name in self.weights)
        return components
