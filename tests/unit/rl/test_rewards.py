"""The reward layer a recipe configures: remote scorers over real loopback HTTP, the weighted composite, the
aesthetic head's file format, and the recipe checks that catch a bad reward setup before a run starts."""

from __future__ import annotations

import pickle
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file
from score_server import ScoreServer

from unirl_core.config import RecipeError, recipe_from_tree
from unirl_core.config.schema import RemoteScorerConfig, RewardConfig
from unirl_core.models.tiny_clip import write_tiny_aesthetic_head
from unirl_core.rewards import functions
from unirl_core.rewards.aesthetic import load_aesthetic_head
from unirl_core.rewards.remote import RemoteScorer
from unirl_core.rewards.service import RewardError, RewardService, ScorerUnavailableError

IDS = [f"prompt:{i // 2}:sample:{i % 2}" for i in range(5)]


@pytest.fixture(scope="module")
def score_server_module():
    server = ScoreServer().start()
    yield server
    server.stop()


@pytest.fixture
def score_server(score_server_module):
    score_server_module.reset()
    return score_server_module


@pytest.fixture(scope="module")
def images():
    return [Image.new("RGB", (8, 8), (40 * i, 10 * i, 200 - 30 * i)) for i in range(5)]


def scorer(server, **settings) -> RemoteScorer:
    return RemoteScorer.from_config(RemoteScorerConfig(url=server.url, backoff_s=0.01, **settings))


# --- remote scorer --------------------------------------------------------------------------------------------


def test_remote_scores_come_back_in_order_across_batches(score_server, images):
    prompts = [f"prompt {i}" for i in range(5)]
    scores = scorer(score_server, batch_size=2)(images, prompts, IDS)
    assert np.allclose(scores, functions.brightness(images), atol=1e-12)  # PNG is lossless: the server saw our pixels
    bodies = [request["body"] for request in score_server.requests]
    assert [len(body["images"]) for body in bodies] == [2, 2, 1]
    assert sum((body["prompts"] for body in bodies), []) == prompts
    assert sum((body["sample_ids"] for body in bodies), []) == IDS
    assert sum((body["metadata"] for body in bodies), []) == [{}] * 5  # no metadata: one empty object per image
    records = [{"tag": "counting", "include": [{"class": "cat", "count": i}]} for i in range(5)]
    service = RewardService({"remote_luma": 1.0}, scorers={"remote_luma": scorer(score_server, batch_size=2)})
    service.score(images, prompts, IDS, records)
    assert sum((r["body"]["metadata"] for r in score_server.requests[len(bodies) :]), []) == records


def test_remote_videos_go_as_chosen_frames_or_as_whole_mp4s(score_server):
    from unirl_core.config.schema import VideoRewardConfig
    from unirl_core.data.video import Video

    videos = [Video(tuple(Image.new("RGB", (16, 16), (g, g, g)) for g in (40, 80, 120, 160, 200)), fps=8)] * 2
    frames = {"judge": RemoteScorerConfig(url=score_server.url)}
    config = RewardConfig(
        weights={"judge": 1.0}, remote=frames, video=VideoRewardConfig(frames="mean", sample_frames=3)
    )
    scores = RewardService.from_config(config).score(videos, ["a", "b"], ["v0", "v1"])["judge"]
    assert [len(r["body"]["images"]) for r in score_server.requests] == [6]  # frames 0, 2, 4 of each video
    np.testing.assert_allclose(scores, [120 / 255] * 2, atol=1e-6)  # their mean luma, lossless PNG

    score_server.reset()
    whole = {"judge": RemoteScorerConfig(url=score_server.url, videos="mp4")}
    config = RewardConfig(weights={"judge": 1.0}, remote=whole, video=VideoRewardConfig(frames="first"))
    scores = RewardService.from_config(config).score(videos, ["a", "b"], ["v0", "v1"])["judge"]
    (body,) = [r["body"] for r in score_server.requests]
    assert "images" not in body and len(body["videos"]) == 2 and body["fps"] == [8.0, 8.0]
    np.testing.assert_allclose(scores, [120 / 255] * 2, atol=0.01)  # every frame, through H.264


def test_remote_retries_a_503_then_succeeds(score_server, images):
    score_server.fail_first = 2
    scores = scorer(score_server, retries=3)(images, ["p"] * 5, IDS)
    assert np.allclose(scores, functions.brightness(images))
    assert len(score_server.requests) == 3


def test_remote_out_of_retries_names_url_and_status(score_server, images):
    score_server.fail_first = 10
    with pytest.raises(ScorerUnavailableError, match=rf"{score_server.url} answered HTTP 503 after every retry"):
        scorer(score_server, retries=1)(images, ["p"] * 5, IDS)
    assert len(score_server.requests) == 2


def test_remote_read_timeout_is_a_clear_error_and_not_retried(score_server, images):
    score_server.delay_s = 1.0
    with pytest.raises(ScorerUnavailableError, match=rf"{score_server.url} is unreachable: no answer within the read"):
        scorer(score_server, read_timeout_s=0.2, retries=3)(images, ["p"] * 5, IDS)
    assert len(score_server.requests) == 1


def test_remote_connection_refused_names_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/score"  # closed again before the request
    remote = RemoteScorer(url, retries=1, backoff_s=0.01)
    with pytest.raises(ScorerUnavailableError, match=rf"{url} is unreachable"):
        remote([Image.new("RGB", (4, 4))], ["p"], ["s0"])


def test_unirl_rewards_score_reports_a_failing_scorer_in_one_line(score_server, tmp_path):
    """An HTML 501 page (permanent: exit 2) and a refused connection (transient: exit 1) end the command with one
    `error:` line naming the URL, without a traceback."""
    from typer.testing import CliRunner

    from flows.cli import app

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    score_server.status, score_server.body = 501, b"<html>\n  <body>\n    <p>Unsupported method</p>\n</html>\n"
    args = ["rewards", "score", str(tmp_path / "a.png"), "-r", "judge", "--set"]
    result = CliRunner().invoke(app, [*args, f"train.reward.remote.judge.url={score_server.url}"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr == (
        f"error: remote scorer {score_server.url} answered HTTP 501: '<html> <body> <p>Unsupported method</p> </html>'\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/score"  # closed again before the request
    result = CliRunner().invoke(app, [*args, f"train.reward.remote.judge.url={url}", "--set",
                                      "train.reward.remote.judge.retries=0"])  # fmt: skip
    assert result.exit_code == 1 and "Traceback" not in result.output and len(result.stderr.splitlines()) == 1
    assert (
        result.stderr.startswith(f"error: remote scorer {url} is unreachable")
        and "then run the command" in result.stderr
    )


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (200, b'{"scores": [0.5, 0.5]}', "returned 2 scores for 5 images"),
        (200, b"<html>oops</html>", "non-JSON body '<html>oops</html>'"),
        (200, b'{"score": [1, 2, 3, 4, 5]}', "without a `scores` list"),
        (200, b'{"scores": [1, 2, null, "4", 5]}', r"non-numeric scores for samples \['prompt:1:sample:0', 'prompt:1:"),
        (400, b'{"error": "images must be 512px"}', 'answered HTTP 400: \'{"error": "images must be 512px"}\''),
    ],
)
def test_remote_bad_answers_are_reward_errors_naming_url(score_server, images, status, body, message):
    score_server.status, score_server.body = status, body
    with pytest.raises(RewardError, match=rf"remote scorer {score_server.url} .*{message}"):
        scorer(score_server)(images, ["p"] * 5, IDS)
    assert len(score_server.requests) == 1  # permanent: not retried


def test_remote_sends_auth_header_from_env_and_never_shows_it(score_server, images, monkeypatch):
    monkeypatch.setenv("SCORER_TOKEN", "Bearer s3cret")
    remote = scorer(score_server, auth_header_env="SCORER_TOKEN")
    remote(images[:1], ["p"], IDS[:1])
    assert score_server.requests[0]["headers"]["Authorization"] == "Bearer s3cret"
    assert "s3cret" not in repr(remote)
    score_server.status, score_server.body = 401, b"bad token"
    with pytest.raises(RewardError) as info:
        remote(images[:1], ["p"], IDS[:1])
    assert "401" in str(info.value) and "s3cret" not in str(info.value)
    monkeypatch.delenv("SCORER_TOKEN")
    with pytest.raises(ValueError, match="environment variable SCORER_TOKEN .* is unset"):
        scorer(score_server, auth_header_env="SCORER_TOKEN")


# --- the composite ---------------------------------------------------------------------------------------------


def test_composite_total_is_the_weighted_sum_with_remote_rewards(score_server, images):
    config = RewardConfig(
        weights={"brightness": 2.0, "judge": 0.5},
        guards=["edge_density", "judge"],
        remote={"judge": RemoteScorerConfig(url=score_server.url)},
    )
    scored = RewardService.from_config(config).score(images, ["p"] * 5, IDS)
    assert set(scored) == {"total", "brightness", "judge", "edge_density"}
    assert np.allclose(scored["judge"], functions.brightness(images))
    assert np.allclose(scored["total"], 2.0 * scored["brightness"] + 0.5 * scored["judge"])


def test_service_refuses_a_remote_nan_naming_the_sample(score_server, images):
    score_server.status, score_server.body = 200, b'{"scores": [1, 2, NaN, 4, 5]}'
    config = RewardConfig(weights={"judge": 1.0}, guards=[], remote={"judge": RemoteScorerConfig(url=score_server.url)})
    with pytest.raises(RewardError, match=r"reward judge is NaN or infinite for samples \['prompt:1:sample:0'\]"):
        RewardService.from_config(config).score(images, ["p"] * 5, IDS)


def test_service_from_config_refuses_what_validation_refuses():
    with pytest.raises(ValueError, match=r"clip\.model_path: got None; clip_score is weighted or a guard"):
        RewardService.from_config(RewardConfig(weights={"clip_score": 1.0}))


# --- recipe validation -----------------------------------------------------------------------------------------


def reward_issues(reward: dict) -> dict[str, str]:
    tree = {"train": {"data": {"source": "smoke"}, "reward": reward}}
    with pytest.raises(RecipeError) as info:
        recipe_from_tree(tree)
    return {issue.path: str(issue) for issue in info.value.issues}


def test_recipe_refuses_unknown_reward_names_with_the_choices():
    issues = reward_issues({"weights": {"sharpness": 1.0}, "guards": ["brightnes"]})
    assert "an unknown reward: choose one of" in issues["train.reward.weights.sharpness"]
    assert "'jpeg_compressibility'" in issues["train.reward.weights.sharpness"]
    assert "add remote.brightnes" in issues["train.reward.guards.brightnes"]


def test_recipe_refuses_model_rewards_without_their_files():
    issues = reward_issues({"weights": {"clip_score": 1.0}, "guards": ["aesthetic"], "aesthetic": {"head_path": "h"}})
    assert "set train.reward.clip.model_path to a local CLIP folder" in issues["train.reward.clip.model_path"]
    assert "aesthetic.clip_model_path" in str(issues["train.reward.aesthetic.clip_model_path"])
    assert "train.reward.aesthetic.head_path" not in issues


def test_recipe_refuses_bad_remote_settings_without_echoing_a_secret():
    issues = reward_issues(
        {
            "weights": {"judge": 1.0, "brightness": 1.0},
            "remote": {
                "judge": {"url": "scorer:8000/score", "auth_header_env": "Bearer abc123"},
                "brightness": {"url": "http://x/score"},
            },
        }
    )
    assert "an http:// or https:// URL" in issues["train.reward.remote.judge.url"]
    secret_issue = issues["train.reward.remote.judge.auth_header_env"]
    assert "the NAME of an environment variable" in secret_issue and "abc123" not in secret_issue
    assert "a built-in reward's name" in issues["train.reward.remote.brightness"]


def test_recipe_with_every_reward_kind_validates():
    tree = yaml.safe_load(
        """
        train:
          data: {source: smoke}
          reward:
            weights: {clip_score: 1.0, aesthetic: 0.1, judge: 0.5}
            guards: [brightness]
            clip: {model_path: /models/clip-vit-large-patch14}
            aesthetic: {clip_model_path: /models/clip-vit-large-patch14, head_path: /models/aesthetic.safetensors}
            remote:
              judge: {url: "http://scorer:8000/score", auth_header_env: SCORER_TOKEN, retries: 5}
        """
    )
    reward = recipe_from_tree(tree).train.reward
    assert reward.remote["judge"].retries == 5 and reward.remote["judge"].read_timeout_s == 120.0
    assert RewardConfig().weights == {"jpeg_compressibility": 1.0}  # the old recipes' default still holds


# --- aesthetic head file ---------------------------------------------------------------------------------------


def test_aesthetic_head_loads_the_laion_layout(tmp_path):
    path = write_tiny_aesthetic_head(tmp_path / "head.safetensors", embed_dim=12)
    head = load_aesthetic_head(path)
    assert [linear.in_features for linear in head.linears] == [12, 32, 16, 8, 4]
    embeddings = torch.nn.functional.normalize(torch.randn(3, 12), dim=-1)
    from safetensors.torch import load_file

    state, expected = load_file(str(path)), embeddings
    for index in (0, 2, 4, 6, 7):  # the LAION head: linears, no activations
        expected = expected @ state[f"layers.{index}.weight"].T + state[f"layers.{index}.bias"]
    assert torch.allclose(head(embeddings), expected.squeeze(-1), atol=1e-6)


class _Boom:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_aesthetic_head_refuses_pickle_without_running_it(tmp_path):
    marker = tmp_path / "pickle-ran"
    for name in ("head.pth", "head.safetensors"):
        (tmp_path / name).write_bytes(pickle.dumps({"layers.0.weight": _Boom(marker)}))
    with pytest.raises(ValueError, match=r"only \.safetensors files are loaded \(never pickle\).*weights_only=True"):
        load_aesthetic_head(tmp_path / "head.pth")
    with pytest.raises(ValueError, match="is not a valid safetensors file"):
        load_aesthetic_head(tmp_path / "head.safetensors")
    assert not marker.exists()


def test_aesthetic_head_names_a_broken_layout(tmp_path):
    path = tmp_path / "head.safetensors"
    save_file({"layers.0.weight": torch.ones(4, 8), "layers.0.bias": torch.ones(4), "layers.2.weight": torch.ones(1, 5),
               "layers.2.bias": torch.ones(1)}, str(path))  # fmt: skip
    with pytest.raises(ValueError, match=r"layers\.2 takes 5 inputs, not 4"):
        load_aesthetic_head(path)
    save_file({"mlp.0.weight": torch.ones(1, 8)}, str(path))
    with pytest.raises(ValueError, match=r"unexpected key 'mlp\.0\.weight'"):
        load_aesthetic_head(path)
