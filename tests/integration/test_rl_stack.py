"""The rollout and train stack on the tiny families: invariants that must hold before "it learns" can mean anything."""

from __future__ import annotations

import pytest
import torch

from unirl_core.config import recipe_from_tree
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack
from unirl_core.models.registry import build_family

pytestmark = pytest.mark.slow


def train_config(family: str, **algorithm):
    return recipe_from_tree(
        {
            "train": {
                "data": {"source": "smoke", "prompts_per_rollout": 2},
                "sampling": {
                    "samples_per_prompt": 2,
                    "num_inference_steps": 3,
                    "guidance_scale": 3.0,
                    "height": 32,
                    "width": 32,
                },
                "model": {"family": family, "path": f"tiny:{family}"},
                "algorithm": {"eta": 1.0, "micro_batch_size": 2, **algorithm},
                "steps": 2,
            }
        }
    ).train


@pytest.mark.parametrize("family", ["sd3", "sd15"])
def test_first_ratio_is_exactly_one_and_runs_repeat_bit_identically(family, tmp_path):
    from local_training import train_locally

    config = train_config(family)
    first, second = train_locally(config, tmp_path / "a"), train_locally(config, tmp_path / "b")
    assert first[0]["ratio_mean"] == 1.0 and first[0]["ratio_min"] == 1.0 and first[0]["clip_fraction"] == 0.0
    for a, b in zip(first, second, strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["loss"] == b["loss"]  # same seed, same run
    assert first[1]["grad_norm"] > 0


def test_kl_is_zero_before_updates_and_grows_after(tmp_path):
    config = train_config("sd3", beta=0.1, learning_rate=1e-2, clip_range=0.5)
    adapter = build_family(config.model, config.sampling)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    stack = TrainStack(adapter, config.algorithm)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    first = stack.train(rollout, advantages, step=0)
    assert first["kl"] == 0.0  # LoRA B starts at zero: the policy equals the reference
    later = stack.train(rollout, advantages, step=1)
    assert later["kl"] > 0.0


def test_siblings_share_their_initial_noise_only_when_asked():
    config = train_config("sd3")
    samples = expand_groups(build_source(config.data).next_batch(), 2)
    adapter = build_family(config.model, config.sampling)
    own = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0).latents_TB[0]
    config.sampling.share_group_noise = True
    shared = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0).latents_TB[0]
    assert (
        torch.equal(shared[0], shared[1])
        and torch.equal(shared[2], shared[3])
        and not torch.equal(shared[0], shared[2])
    )
    assert not torch.equal(own[0], own[1])


def test_samples_regenerate_their_initial_noise_from_seed_and_id():
    config = train_config("sd3")
    adapter = build_family(config.model, config.sampling)
    a = adapter.initial_noise(["prompt:0:sample:0", "prompt:0:sample:1"], 7, (4, 8, 8))
    b = adapter.initial_noise(["prompt:0:sample:1"], 7, (4, 8, 8))
    assert torch.equal(a[1], b[0]) and not torch.equal(a[0], a[1])


@pytest.mark.parametrize("family", ["sd3", "sd15"])
def test_text_embedding_cache_serves_the_same_conditioning_without_the_text_encoders(family, tmp_path):
    config = train_config(family)
    prompts = ["a red cube", "a red cube", "a blue ball"]  # siblings repeat a prompt: encoded once
    plain = build_family(config.model, config.sampling).encode(prompts)
    cached_model = config.model.model_copy(update={"text_embedding_cache": str(tmp_path / "cache")})
    first = build_family(cached_model, config.sampling)
    assert first.encode(prompts).keys() == plain.keys()
    assert first.texts.misses == 3  # two prompts and the negative prompt
    second = build_family(cached_model, config.sampling)
    second.texts.encode = None  # a hit must never reach the text encoders
    served = second.encode(prompts)
    assert second.texts.hits == 3 and second.texts.misses == 0
    for key, value in plain.items():
        assert served[key].shape == value.shape and torch.allclose(served[key], value, atol=1e-5), key
    from unirl_core.models.registry import write_tiny_model

    other_weights = write_tiny_model(tmp_path / "other", family, seed=1)
    other = build_family(cached_model.model_copy(update={"path": str(other_weights)}), config.sampling)
    assert other.texts.cache.folder != first.texts.cache.folder  # other text encoders never read these entries


def _condition_examples(tmp_path, colours):
    from PIL import Image

    from unirl_core.data.prompts import MediaRef, PromptExample

    examples = []
    for i, colour in enumerate(colours):
        path = tmp_path / f"cond{i}.png"
        Image.new("RGB", (48, 40), colour).save(path)
        examples.append(PromptExample("make it brighter", f"p{i}", {}, (MediaRef("image", "condition", str(path)),)))
    return examples


@pytest.mark.parametrize("family", ["sd3", "sd15"])
def test_condition_images_start_image_to_image_and_train(family, tmp_path):
    from unirl_core.domains.diffusion.rollout.rollout import start_step

    config = train_config(family)
    config = config.model_copy(update={"sampling": config.sampling.model_copy(update={"num_inference_steps": 4})})
    config.sampling.condition_strength = 0.5
    adapter = build_family(config.model, config.sampling)
    samples = expand_groups(_condition_examples(tmp_path, ["red", "navy"]), 2)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    assert start_step(4, 0.5) == 2 and rollout.steps == [2, 3]  # only the last half of the steps runs
    from PIL import Image

    clean = adapter.encode_images([Image.new("RGB", (32, 32), "red")])
    noise = adapter.initial_noise([samples[0].sample_id], 0, adapter.latent_shape(32, 32))
    assert torch.allclose(rollout.latents_TB[0, 0], adapter.noised(clean, noise, 2, rollout.schedule)[0], atol=1e-5)
    first_red, first_navy = (torch.tensor(list(im.getdata()), dtype=torch.float) for im in rollout.images[::2])
    assert not torch.equal(first_red, first_navy)  # the condition image shapes the result
    metrics = TrainStack(adapter, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0


def test_condition_images_are_loaded_like_downloads(tmp_path):
    from unirl_core.data.prompts import PromptExample
    from unirl_core.domains.diffusion.rollout.conditions import ConditionImageError, load_condition_image

    with pytest.raises(ConditionImageError, match=r"169\.254\.169\.254.*blocked"):
        load_condition_image("http://169.254.169.254/latest/meta-data", 32, 32)
    with pytest.raises(ConditionImageError, match="blocked_scheme"):
        load_condition_image("ftp://example.com/a.png", 32, 32)
    (tmp_path / "notes.txt").write_text("not an image")
    with pytest.raises(ConditionImageError, match=r"notes\.txt: decode_error"):
        load_condition_image(str(tmp_path / "notes.txt"), 32, 32)
    assert load_condition_image(str(_condition_examples(tmp_path, ["red"])[0].media_refs[0].uri), 32, 16).size == (
        32,
        16,
    )
    config = train_config("sd3")
    adapter = build_family(config.model, config.sampling)
    mixed = [*_condition_examples(tmp_path, ["red"]), PromptExample("a plain prompt", "plain", {}, ())]
    with pytest.raises(ValueError, match="mixes prompts with and without condition images"):
        run_rollout(adapter, expand_groups(mixed, 2), config.sampling, config.algorithm, seed=0)
