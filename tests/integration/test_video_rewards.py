"""Video rewards with real parts: `temporal_consistency` on a tiny CLIP (transformers' CLIPModel, random weights,
from a folder) scores a still video about 1 and above a video of unrelated frames; `clip_score` on videos is CLIP's
score of the chosen frames, aggregated; `unirl rewards score clip.mp4` loads both; a round's video samples land as
mp4 files with their prompts beside the sample grid, on disk and in a real MLflow (sqlite)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from unirl_core.config.schema import ClipRewardConfig, RewardConfig, VideoRewardConfig
from unirl_core.data.video import Video, encode_mp4, read_video
from unirl_core.models.tiny_clip import write_tiny_clip
from unirl_core.rewards.clip import ClipScore
from unirl_core.rewards.service import RewardService

pytestmark = pytest.mark.slow  # a tiny CLIP and an MLflow store: a few seconds each


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    return write_tiny_clip(tmp_path_factory.mktemp("tiny-clip") / "clip", seed=0)


def noise_video(count: int, seed: int, still: bool = False) -> Video:
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(1 if still else count)]
    return Video(tuple(Image.fromarray(frames[0 if still else t]) for t in range(count)))


def test_temporal_consistency_is_one_for_a_still_video_and_lower_for_unrelated_frames(clip_folder):
    config = RewardConfig(weights={"temporal_consistency": 1.0}, guards=[],
                          clip=ClipRewardConfig(model_path=str(clip_folder), batch_size=3))  # fmt: skip
    service = RewardService.from_config(config)
    still, jumpy = noise_video(6, seed=0, still=True), noise_video(6, seed=1)
    scores = service.score([still, jumpy, noise_video(1, seed=2)], ["a", "b", "c"], ["s0", "s1", "s2"])
    consistency = scores["temporal_consistency"]
    assert consistency[0] == pytest.approx(1.0, abs=1e-5) and consistency[2] == 1.0  # one frame: still
    assert consistency[1] < consistency[0] - 1e-3
    from unirl_core.rewards.clip import load_clip  # the reference: consecutive cosines of CLIP's embeddings

    e = load_clip(clip_folder).embed_images(list(jumpy.frames)).double().numpy()
    assert consistency[1] == pytest.approx((e[1:] * e[:-1]).sum(-1).mean(), abs=1e-6)


def test_clip_score_on_videos_is_the_chosen_frames_clip_score_aggregated(clip_folder):
    video = noise_video(7, seed=3)  # 4 of 7 frames: 0, 2, 4, 6
    config = RewardConfig(weights={"clip_score": 1.0}, guards=[], clip=ClipRewardConfig(model_path=str(clip_folder)),
                          video=VideoRewardConfig(frames="mean"))  # fmt: skip
    got = RewardService.from_config(config).score([video], ["a cat"], ["s0"])["clip_score"]
    frames = ClipScore(clip_folder)([video.frames[i] for i in (0, 2, 4, 6)], ["a cat"] * 4)
    assert got.tolist() == pytest.approx([frames.mean()], abs=1e-6)
    first = RewardService.from_config(config.model_copy(update={"video": VideoRewardConfig()}))
    assert first.score([video], ["a cat"], ["s0"])["clip_score"] == pytest.approx(frames[:1], abs=1e-6)


def test_rewards_score_loads_a_model_reward_for_an_mp4(clip_folder, tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    path = tmp_path / "clip.mp4"
    path.write_bytes(encode_mp4(noise_video(5, seed=4, still=True)))
    result = CliRunner().invoke(app, ["rewards", "score", str(path), "-r", "clip_score", "-r", "temporal_consistency",
                                      "--prompt", "noise", "--set", f"train.reward.clip.model_path={clip_folder}"])  # fmt: skip
    assert result.exit_code == 0, result.output
    row = result.stdout.splitlines()[1].split()
    decoded = read_video(path)
    assert float(row[-2]) == pytest.approx(ClipScore(clip_folder)(decoded.frames[:1], ["noise"])[0], abs=1e-3)
    assert float(row[-1]) > 0.99  # still (up to H.264's noise)


def test_a_rounds_video_samples_land_as_mp4s_with_their_prompts_beside_the_grid(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from unirl_core.config import load_recipe
    from unirl_core.controller.grids import Grids
    from unirl_core.controller.round_plan import plan_rounds
    from unirl_core.tracking.run_tracker import RunTracker
    from unirl_core.worker.images import STRIP_GAP

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("UNIRL_HOME", str(tmp_path / "home"))
    config = load_recipe("demo", ["train.sampling.samples_per_prompt=2", "train.grid_images_per_prompt=2"]).train
    tracker = RunTracker(tmp_path / "out", "videos", "demo")
    tracker.open()
    round_ = plan_rounds(config)[0]
    videos = [noise_video(5, seed=s) for s in range(4)]
    grid_file = Grids(config, round_, None, tracker, tmp_path / "out").save_samples(videos, ["a cat", "a dog"])
    folder = tmp_path / "out" / "samples" / f"round_000_step_{round_.end - 1:08d}"
    assert grid_file == str(folder) + ".png" and Image.open(grid_file).width == 2 * (4 * 32 + STRIP_GAP)
    assert json.loads((folder / "prompts.json").read_text()) == {
        "prompt_0_sample_0.mp4": "a cat", "prompt_0_sample_1.mp4": "a cat",
        "prompt_1_sample_0.mp4": "a dog", "prompt_1_sample_1.mp4": "a dog",
    }  # fmt: skip
    assert len(read_video(folder / "prompt_1_sample_1.mp4")) == 5
    logged = {a.path for a in MlflowClient(uri).list_artifacts(tracker.run_id, f"samples/{folder.name}")}
    assert logged == {f"samples/{folder.name}/{name}" for name in ["prompts.json", *json.loads(
        (folder / "prompts.json").read_text())]}  # fmt: skip
    grids = {a.path for a in MlflowClient(uri).list_artifacts(tracker.run_id, "samples")}
    assert f"samples/{folder.name}.png" in grids  # the grid, next to its videos


def test_video_judge_asks_about_the_spaced_frames_in_one_chat_turn(tmp_path):
    """`video_judge` on a tiny LLaVA (several images per turn): its score is the model's own next-token softmax
    over yes/no after one chat turn holding the video's 3 evenly spaced frames then the question (by hand); the
    frames matter; it is a video reward through the service and `train.reward.video_judge`."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from unirl_core.models.tiny_vlm import write_tiny_vlm
    from unirl_core.rewards.vlm_judge import VIDEO_QUESTIONS, VideoJudgeScore

    folder = write_tiny_vlm(tmp_path / "vlm", seed=0)
    videos = [noise_video(7, seed=1), noise_video(7, seed=2)]
    judge = VideoJudgeScore(folder, frames=3)
    scores = judge(videos, ["a ball", "a cat"])

    processor, model = AutoProcessor.from_pretrained(folder), AutoModelForImageTextToText.from_pretrained(folder)
    ids = processor.tokenizer.convert_tokens_to_ids(["yes", "Yes", "no", "No"])
    expected = []
    for video, prompt in zip(videos, ["a ball", "a cat"], strict=True):
        question = VIDEO_QUESTIONS["yes_no"].replace("{prompt}", prompt)
        content = [{"type": "image"}] * 3 + [{"type": "text", "text": question}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
        frames = [video.frames[i] for i in (0, 3, 6)]  # evenly spaced, first and last included
        with torch.no_grad():
            logits = model(**processor(text=[text], images=frames, return_tensors="pt")).logits[0, -1]
        probs = torch.softmax(logits[ids].double(), dim=-1)
        expected.append(float(probs[:2].sum()))
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert scores[0] != scores[1]

    config = RewardConfig(weights={"video_judge": 1.0}, video_judge={"model_path": str(folder), "frames": 3})
    total = RewardService.from_config(config).score(videos, ["a ball", "a cat"], ["v0", "v1"])["total"]
    np.testing.assert_allclose(total, scores, atol=1e-6)
