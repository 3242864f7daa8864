"""Rewards of videos (`unirl_core.data.video.Video` outputs): image rewards frame by frame, and rewards of motion.

Image rewards on videos (`train.reward.video`): every image reward scores `frames` of each video and the scores
aggregate to one float per video.

| frames | frames scored                                   | score of a video  |
|--------|-------------------------------------------------|-------------------|
| first  | the first (UniRL's: PickScore of frame 0)       | its score         |
| mean   | `sample_frames` evenly spaced, first and last in | their mean        |
| min    | the same frames                                 | their minimum     |

Rewards of videos only (a video family's; refused on an image family's recipe):

| name                 | score                                                                     | model          |
|----------------------|---------------------------------------------------------------------------|----------------|
| frame_smoothness     | -(mean absolute luma difference of consecutive frames, luma in [0, 1])   | none           |
| temporal_consistency | mean cosine of consecutive frames' CLIP image embeddings (at most 1)     | `reward.clip`  |
| video_judge          | a chat VLM's P(yes) or expected digit, shown `frames` frames in order     | `reward.video_judge` |

A one-frame video is as steady as a video can be: frame_smoothness 0, temporal_consistency 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from unirl_core.data.video import Video, spaced_indices

AGGREGATIONS: dict[str, Callable[[np.ndarray], float]] = {"first": lambda s: float(s[0]), "mean": np.mean,
                                                          "min": np.min}  # fmt: skip


def scored_frames(video: Video, frames: str, sample_frames: int) -> list[int]:
    """The indices of `video`'s frames an image reward scores under `train.reward.video`."""
    return [0] if frames == "first" else spaced_indices(len(video), sample_frames)


def score_per_frame(scorer, videos: Sequence[Video], prompts: Sequence[str], sample_ids: Sequence[str],
                    metadata: Sequence[dict] | None, frames: str, sample_frames: int) -> np.ndarray:  # fmt: skip
    """An image reward `scorer` (called as the reward service calls it) on the chosen frames of every video, in one
    call: each frame carries its video's prompt, metadata and id (`<id>:frame:<index>`). [B] aggregated scores."""
    chosen = [scored_frames(video, frames, sample_frames) for video in videos]
    owner = [b for b, indices in enumerate(chosen) for _ in indices]
    images = [videos[b].frames[i] for b, indices in enumerate(chosen) for i in indices]
    ids = [f"{sample_ids[b]}:frame:{i}" for b, indices in enumerate(chosen) for i in indices]
    args = (images, [prompts[b] for b in owner], ids)
    if getattr(scorer, "wants_metadata", False):
        given = [metadata[b] if metadata is not None else {} for b in owner]
        scores = np.asarray(scorer(*args, metadata=given), dtype=np.float64)
    else:
        scores = np.asarray(scorer(*args), dtype=np.float64)
    if scores.shape != (len(images),):
        return scores  # the service names the wrong count
    bounds = np.cumsum([0, *map(len, chosen)])
    return np.array([AGGREGATIONS[frames](scores[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)])


def _luma_TN(video: Video) -> np.ndarray:
    return np.stack([np.asarray(f.convert("L"), dtype=np.float64).ravel() / 255.0 for f in video.frames])


def frame_smoothness(videos: Sequence[Video], prompts=()) -> np.ndarray:
    """-(mean |luma(t+1) - luma(t)|) over consecutive frames and pixels: 0 for a still video, -1 at most flicker."""
    _check_videos(videos, "frame_smoothness")
    return np.array([-np.abs(np.diff(_luma_TN(v), axis=0)).mean() if len(v) > 1 else 0.0 for v in videos])


def _check_videos(outputs, name: str) -> None:
    from unirl_core.rewards.errors import RewardError

    if not all(isinstance(o, Video) for o in outputs):
        raise RewardError(f"reward {name} scores videos, and these outputs are {type(outputs[0]).__name__}s: "
                          "use it with a video family only")  # fmt: skip


class TemporalConsistency:
    """The `temporal_consistency` reward: the mean cosine similarity of consecutive frames' CLIP image embeddings
    (`reward.clip`'s folder, shared with `clip_score`; every frame, `batch_size` frames per forward)."""

    def __init__(self, model_path: str | Path, device: str = "cpu", batch_size: int = 32):
        from unirl_core.rewards.clip import load_clip

        self.clip, self.batch_size = load_clip(model_path, device), batch_size

    def __call__(self, videos: Sequence[Video], prompts: Sequence[str] = (), sample_ids: Sequence[str] = ()):
        from unirl_core.rewards.clip import in_batches

        _check_videos(videos, "temporal_consistency")
        if not videos:
            return np.zeros(0)
        frames = [frame for video in videos for frame in video.frames]
        embeddings_ND = in_batches(self.clip.embed_images, frames, self.batch_size).cpu().double().numpy()
        scores, start = [], 0
        for video in videos:
            e_TD = embeddings_ND[start : start + len(video)]
            scores.append(float((e_TD[1:] * e_TD[:-1]).sum(axis=-1).mean()) if len(video) > 1 else 1.0)
            start += len(video)
        return np.array(scores)


VIDEO_REWARDS = {"frame_smoothness": frame_smoothness}  # weight-free
VIDEO_MODEL_REWARDS = {"temporal_consistency": "clip", "video_judge": "video_judge"}  # name -> its RewardConfig section

DESCRIPTIONS = {
    "frame_smoothness": ("video: -(mean |luma change| between consecutive frames), 0 = still", "video outputs"),
    "temporal_consistency": (
        "video: mean cosine of consecutive frames' CLIP image embeddings (<= 1)",
        "video outputs; reward.clip.model_path: a CLIP folder",
    ),
    "video_judge": (
        "video: a VLM's P(yes) (or expected 1-9 digit) shown `frames` frames in order",
        "video outputs; reward.video_judge.model_path: a local chat VLM folder (e.g. Qwen2-VL-2B-Instruct)",
    ),
}
