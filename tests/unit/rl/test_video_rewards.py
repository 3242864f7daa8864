"""Rewards of video outputs, on synthetic videos whose scores are worked out by hand: image rewards score the frames
`train.reward.video` names and aggregate them per video (images score exactly as before); `frame_smoothness`
tells a still video from a flickering one; a recipe pairing a family with a reward of another kind is refused
naming both; the config hash of a recipe without the section is unchanged; grids show videos as frame strips;
mp4 files round-trip; `unirl rewards score clip.mp4` scores a file as the service does."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from unirl_core.config import load_recipe
from unirl_core.config.recipe import RecipeError
from unirl_core.config.schema import VideoRewardConfig
from unirl_core.data.video import Video, encode_mp4, read_video, spaced_indices
from unirl_core.rewards import functions
from unirl_core.rewards.errors import RewardError
from unirl_core.rewards.service import RewardService

GREYS = [100, 200, 20, 150, 60]  # frame t is one flat grey; its luma (brightness x 255) is GREYS[t]


def grey_video(greys=GREYS, size=(8, 6)) -> Video:
    return Video(tuple(Image.new("RGB", size, (g, g, g)) for g in greys), fps=8.0)


def brightness(video: Video, frames: str, sample_frames: int = 4) -> float:
    service = RewardService({"brightness": 1.0}, video=VideoRewardConfig(frames=frames, sample_frames=sample_frames))
    scores = service.score([video], ["a grey video"], ["s0"])
    assert scores["total"].shape == (1,)  # one float per video
    return float(scores["brightness"][0])


def test_image_rewards_score_the_chosen_frames_and_aggregate_them_per_video():
    video = grey_video()
    assert brightness(video, "first") == pytest.approx(100 / 255)  # UniRL's default: the first frame alone
    # 4 evenly spaced frames of 5, first and last included: 0, 1, 3, 4 (round(4/3) = 1, round(8/3) = 3)
    assert brightness(video, "mean") == pytest.approx((100 + 200 + 150 + 60) / 4 / 255)
    assert brightness(video, "min") == pytest.approx(60 / 255)  # frame 2 (20) is not among them
    assert brightness(video, "min", sample_frames=5) == pytest.approx(20 / 255)  # every frame: it is
    assert brightness(video, "mean", sample_frames=1) == pytest.approx(100 / 255)


def test_frames_are_spaced_evenly_with_the_first_and_the_last():
    assert spaced_indices(81, 4) == [0, 27, 53, 80]
    assert spaced_indices(5, 4) == [0, 1, 3, 4]
    assert spaced_indices(3, 4) == [0, 1, 2]  # a shorter video: every frame
    assert spaced_indices(1, 4) == [0] and spaced_indices(9, 1) == [0]


def test_images_score_exactly_as_before_whatever_the_video_section():
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(3)]
    service = RewardService({"jpeg_compressibility": 1.0}, ["edge_density"], video=VideoRewardConfig(frames="min"))
    scores = service.score(images, ["p"] * 3, ["a", "b", "c"])
    assert np.array_equal(scores["jpeg_compressibility"], functions.jpeg_compressibility(images))
    assert np.array_equal(scores["edge_density"], functions.edge_density(images))


def test_each_scored_frame_carries_its_videos_prompt_and_id():
    seen = {}

    def probe(images, prompts, sample_ids):  # a reward of your own, scored per frame like the image rewards
        seen.update(prompts=list(prompts), ids=list(sample_ids))
        return [float(np.asarray(image).mean()) for image in images]

    service = RewardService({"probe": 1.0}, scorers={"probe": probe}, video=VideoRewardConfig(frames="mean"),
                            per_frame=["probe"])  # fmt: skip
    scores = service.score([grey_video(), grey_video([7, 9])], ["five", "two"], ["v0", "v1"])
    assert scores["probe"].tolist() == [(100 + 200 + 150 + 60) / 4, 8.0]
    assert seen["prompts"] == ["five"] * 4 + ["two"] * 2
    assert seen["ids"] == ["v0:frame:0", "v0:frame:1", "v0:frame:3", "v0:frame:4", "v1:frame:0", "v1:frame:1"]


def test_frame_smoothness_is_zero_for_a_still_video_and_lower_the_more_it_flickers():
    scores = RewardService({"frame_smoothness": 1.0}).score(
        [grey_video([90] * 4), grey_video([0, 255, 0, 255]), grey_video(GREYS), grey_video([5])],
        ["p"] * 4,
        list("abcd"),
    )["frame_smoothness"]
    # GREYS' consecutive changes: 100, 180, 130, 90 -> mean 125 of 255
    assert scores.tolist() == pytest.approx([0.0, -1.0, -125 / 255, 0.0])


def test_a_video_reward_on_images_fails_naming_it():
    with pytest.raises(RewardError, match="reward frame_smoothness scores videos"):
        RewardService({"frame_smoothness": 1.0}).score([Image.new("RGB", (4, 4))], ["p"], ["s"])


@pytest.fixture(scope="module")
def video_family():
    """An image family's class saying it makes videos: what the recipe checks read (`Family.outputs`)."""
    from unirl_core.models.registry import family_class, register

    class VideoProbe(family_class("sd3")):
        name = "video_probe"
        outputs = "video"

    register(VideoProbe)
    return VideoProbe.name


def test_a_reward_of_another_kind_than_the_familys_outputs_is_refused_naming_both(video_family):
    with pytest.raises(RecipeError, match=r"train.reward.guards.frame_smoothness: .*the sd3 family's outputs are "
                                          r"images, and frame_smoothness scores videos"):  # fmt: skip
        load_recipe("demo", ["train.reward.guards=[frame_smoothness]"])
    with pytest.raises(RecipeError, match=r"train.reward.weights.exact_match: .*the video_probe family's outputs "
                                          r"are videos, and exact_match scores texts"):  # fmt: skip
        load_recipe("demo", [f"train.model.family={video_family}", "train.reward.weights={exact_match: 1.0}"])
    with pytest.raises(RecipeError, match=r"temporal_consistency is weighted or a guard, so set "
                                          r"train.reward.clip.model_path"):  # fmt: skip
        load_recipe("demo", [f"train.model.family={video_family}", "train.reward.guards=[temporal_consistency]"])


def test_image_and_video_rewards_are_accepted_on_a_video_family(video_family):
    sets = [f"train.model.family={video_family}", "train.reward.weights={pickscore: 1.0, frame_smoothness: 0.1}",
            "train.reward.pickscore.model_path=/m", "train.reward.video={frames: min, sample_frames: 8}"]  # fmt: skip
    reward = load_recipe("demo", sets).train.reward
    assert reward.video.frames == "min" and reward.video.sample_frames == 8
    with pytest.raises(RecipeError, match=r"train.reward.video.frames: got 'last'"):
        load_recipe("demo", [f"train.model.family={video_family}", "train.reward.video.frames=last"])


def test_an_unknown_family_does_not_stop_the_reward_check():
    # the family is named when training starts (start_problems); loading the recipe checks the rest
    assert load_recipe("demo", ["train.model.family=no_such_family"]).train.model.family == "no_such_family"


def test_the_video_section_at_its_defaults_keeps_the_config_hash():
    """Checkpoints written before `train.reward.video` existed resume: the default section hashes as if absent."""
    from unirl_core.worker.checkpoint import config_hash

    demo = config_hash(load_recipe("demo", []).train)
    assert demo == "70e516967068d97f"  # test_checkpoint_states' hash of the packaged demo
    assert config_hash(load_recipe("demo", ["train.reward.video={frames: first, sample_frames: 4}"]).train) == demo
    assert config_hash(load_recipe("demo", ["train.reward.video.frames=mean"]).train) != demo


def striped_video(count: int = 8, size=(16, 12)) -> Video:
    """Frame t: a flat colour (t x 30, 255 - t x 30, 80) with a white square moving right."""
    frames = []
    for t in range(count):
        pixels = np.zeros((size[1], size[0], 3), dtype=np.uint8) + np.array([t * 30, 255 - t * 30, 80], np.uint8)
        pixels[2:6, t : t + 4] = 255
        frames.append(Image.fromarray(pixels))
    return Video(tuple(frames), fps=12.0)


def test_a_grid_shows_each_video_as_a_strip_of_four_frames():
    from unirl_core.domains.diffusion.domain import DiffusionDomain
    from unirl_core.worker.images import STRIP_GAP

    videos = [striped_video(), striped_video()]
    grid = DiffusionDomain.grid(videos, ["two videos"], cols=2)
    strip = 4 * 16 + STRIP_GAP  # 4 frames of 16 x 12, then a white gap
    assert grid.size == (max(2 * strip, 160), 12 + 24)  # one captioned row of 2 strips
    for cell, t in enumerate(spaced_indices(8, 4) * 2):  # frames 0, 2, 5, 7 of each video
        assert grid.getpixel((cell // 4 * strip + cell % 4 * 16 + 12, 24 + 10)) == (t * 30, 255 - t * 30, 80)
    assert grid.getpixel((strip - 1, 24 + 10)) == (255, 255, 255)


def test_mp4_round_trip_keeps_frames_size_rate_and_pixels():
    video = striped_video()
    data = encode_mp4(video)
    assert data[4:8] == b"ftyp"  # an mp4 container
    back = read_video(data)
    assert len(back) == 8 and back.size == (16, 12) and back.fps == 12.0
    error = [
        np.abs(np.asarray(a, float) - np.asarray(b, float)).mean()
        for a, b in zip(video.frames, back.frames, strict=True)
    ]
    assert max(error) < 8  # H.264 at crf 18 with 4:2:0 chroma: close, not exact, on 16 x 12 pixels


def test_an_odd_sized_video_is_padded_to_even(tmp_path):
    video = grey_video([40, 200], size=(9, 7))
    path = tmp_path / "odd.mp4"
    path.write_bytes(encode_mp4(video))
    back = read_video(path)
    assert back.size == (10, 8) and len(back) == 2
    assert abs(np.asarray(back.frames[1].convert("L"), float).mean() - 200) < 3
    with pytest.raises(ValueError, match=r"not-a-video.mp4: not a video PyAV can read"):
        (tmp_path / "not-a-video.mp4").write_bytes(b"plain text")
        read_video(tmp_path / "not-a-video.mp4")


runner = CliRunner()


def test_rewards_score_reads_videos_and_aggregates_their_frames(tmp_path):
    from flows.cli import app

    path = tmp_path / "clip.mp4"
    path.write_bytes(encode_mp4(grey_video(size=(16, 16))))
    expected = read_video(path)  # the decoded greys (H.264 is close, not exact)
    luma = [np.asarray(f.convert("L"), float).mean() / 255 for f in expected.frames]
    for option, value in ([], luma[0]), (["--frames", "mean"], np.mean([luma[i] for i in (0, 1, 3, 4)])):
        result = runner.invoke(app, ["rewards", "score", str(path), "-r", "brightness", "-r", "frame_smoothness",
                                     *option])  # fmt: skip
        assert result.exit_code == 0, result.output
        row = result.stdout.splitlines()[1].split()
        assert row[0] == str(path) and float(row[-2]) == pytest.approx(value, abs=1e-4)
        assert float(row[-1]) == pytest.approx(-np.abs(np.diff(luma)).mean(), abs=0.01)
    recipe = runner.invoke(app, ["rewards", "score", str(path), "-r", "brightness",
                                 "--set", "train.reward.video={frames: min, sample_frames: 5}"])  # fmt: skip
    assert float(recipe.stdout.splitlines()[1].split()[-1]) == pytest.approx(min(luma), abs=1e-4)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["VIDEO", "-r", "brightness", "--frames", "last"], "--frames last: choose first, mean or min"),
        (["VIDEO", "IMAGE", "-r", "brightness"], "give image files or video files, not both"),
        (["BROKEN", "-r", "brightness"], "broken.webm: not a video PyAV can read"),
    ],
)
def test_bad_video_input_exits_2_with_one_line(tmp_path, arguments, message):
    from flows.cli import app

    files = {"VIDEO": tmp_path / "clip.mp4", "IMAGE": tmp_path / "frame.png", "BROKEN": tmp_path / "broken.webm"}
    files["VIDEO"].write_bytes(encode_mp4(grey_video(size=(8, 8))))
    Image.new("RGB", (8, 8)).save(files["IMAGE"])
    files["BROKEN"].write_bytes(b"not a video")
    result = runner.invoke(app, ["rewards", "score", *(str(files.get(a, a)) for a in arguments)])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
