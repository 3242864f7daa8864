"""The Wan 2.1 families on their tiny models (real WanTransformer3DModel, AutoencoderKLWan, umT5, CLIP vision,
FlowMatchEuler): our schedule + transitions reproduce the stock WanPipeline and WanImageToVideoPipeline, a rollout
stores video latents [T, B, C, F, h, w] and trains (image-to-video: with each prompt's condition image), the warm-up
loss runs on video latents, frames are validated against the VAE's temporal stride, and the exports load in
diffusers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from unirl_core.config import recipe_from_tree
from unirl_core.config.schema import WarmupConfig
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.data.video import Video
from unirl_core.domains.diffusion.domain import DiffusionDomain
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack, WarmupStack
from unirl_core.models.registry import build_family, resolve_model_path

pytestmark = pytest.mark.slow
PROMPTS = ["a red cube", "a blue ball"]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2", "proj_out"]


def train_config(guidance: float = 4.0, frames: int | None = 9, family: str = "wan", **algorithm):
    return recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": 2},
        "sampling": {"samples_per_prompt": 2, "num_inference_steps": 3, "guidance_scale": guidance, "height": 32,
                     "width": 32, "num_frames": frames, "fps": 8},
        "model": {"family": family, "path": f"tiny:{family}",
                  "lora": {"rank": 4, "alpha": 8, "target_modules": TARGETS}},
        "algorithm": {"eta": 0.7, "micro_batch_size": 2, "learning_rate": 0.05, **algorithm},
        "steps": 2,
    }}).train  # fmt: skip


def load(lora: bool = False, guidance: float = 4.0, family: str = "wan"):
    config = train_config(guidance, family=family)
    if not lora:
        config.model.lora = None
    return build_family(config.model, config.sampling), config


def test_eta_zero_reproduces_the_stock_pipeline_latents_and_frames():
    family, config = load()
    shape = family.sample_shape(config.sampling)
    assert shape == (16, 3, 4, 4)  # 9 frames -> 1 + 8 / 4 latent frames; 32 px / VAE 8
    x = family.initial_noise(["s0", "s1"], 0, shape)
    cond = family.encode(PROMPTS)
    schedule, ours = family.schedule(3, shape), x
    with torch.no_grad():
        for index in range(3):
            ours = family.transition(ours, index, 0.0, cond, schedule).sample
    stock = dict(prompt=PROMPTS, negative_prompt="", height=32, width=32, num_frames=9, num_inference_steps=3,
                 guidance_scale=4.0, latents=x)  # fmt: skip
    assert schedule == family.pipeline.scheduler.sigmas.tolist()
    torch.testing.assert_close(family.pipeline(**stock, output_type="latent").frames, ours, atol=1e-5, rtol=0)
    videos = family.decode(ours)
    frames = family.pipeline(**stock, output_type="np").frames  # [B, F, H, W, 3] in [0, 1]
    assert [type(v) for v in videos] == [Video, Video] and len(videos[0]) == 9 and videos[0].size == (32, 32)
    assert videos[0].fps == 8  # sampling.fps
    ours_np = np.stack([np.stack([np.asarray(f, dtype=np.float64) / 255 for f in v.frames]) for v in videos])
    assert np.abs(ours_np - frames).max() <= 1 / 255 + 1e-6  # the same frames, up to 8-bit rounding


def test_rollout_trains_on_video_latents_and_the_warmup_loss_runs(tmp_path):
    config = train_config()
    family = build_family(config.model, config.sampling)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(family, samples, config.sampling, config.algorithm, seed=0)
    assert rollout.latents_TB.shape == (3, 4, 16, 3, 4, 4) and torch.isfinite(rollout.logp_TB).all()
    assert all(isinstance(v, Video) and len(v) == 9 for v in rollout.outputs)
    before = [p.detach().clone() for p in family.parameters()]
    metrics = TrainStack(family, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, family.parameters(), strict=True))

    pixels = torch.rand(2, 3, 9, 32, 32) * 2 - 1
    latents = family.encode_pixels(pixels)
    assert latents.shape == (2, 16, 3, 4, 4)
    text = family.encode_texts(["a red square", "stripes"])
    generators = [torch.Generator().manual_seed(s) for s in range(2)]
    warm = WarmupStack(family, WarmupConfig(learning_rate=1e-2), 1.0).train(latents, text, generators, step=0)
    assert math.isfinite(warm["loss"]) and warm["grad_norm"] > 0


@pytest.mark.parametrize(
    ("family", "frames", "message"),
    [
        ("wan", None, "train.sampling.num_frames: empty, but wan makes videos: set the frames per video, "
                      "(num_frames - 1) % 4 == 0 (e.g. 17)"),
        ("wan", 32, "train.sampling.num_frames: 32, but (num_frames - 1) % 4 = 3: the wan VAE keeps the first frame "
                    "and compresses each 4 after it into one latent frame; use 29 or 33"),
        ("sd3", 9, "train.sampling.num_frames: 9, but sd3 makes images: leave it empty"),
    ],
)  # fmt: skip
def test_frames_are_checked_against_the_vae_with_the_arithmetic(family, frames, message):
    assert message in DiffusionDomain.start_problems(train_config(frames=frames, family=family))
    assert not [p for p in DiffusionDomain.start_problems(train_config(frames=33)) if "num_frames" in p]


def velocity_of(transformer, embeds: torch.Tensor) -> torch.Tensor:
    """The denoiser's output on a fixed video latent: what an exported model must reproduce."""
    x = torch.randn((1, 16, 3, 4, 4), generator=torch.Generator().manual_seed(3))
    return transformer(hidden_states=x, timestep=torch.tensor([600.0]), encoder_hidden_states=embeds[:1],
                       return_dict=False)[0]  # fmt: skip


def test_exports_load_in_the_stock_pipeline(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline, WanTransformer3DModel
    from peft import PeftModel

    family, config = load(lora=True)
    for parameter in family.parameters():  # a trained adapter: gaussian init leaves B at zero
        parameter.data.add_(torch.randn_like(parameter) * 0.1)
    embeds = family.encode_texts(PROMPTS)["embeds"]
    folder = resolve_model_path(config.model.path)
    (tmp_path / "adapter").mkdir()
    with torch.no_grad():
        trained = velocity_of(family.trainable, embeds)
        family.export_adapter(tmp_path / "adapter", folder)
        base = WanTransformer3DModel.from_pretrained(folder, subfolder="transformer")
        assert not torch.allclose(velocity_of(base, embeds), trained, atol=1e-4)
        peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
        torch.testing.assert_close(velocity_of(peft_model, embeds), trained, atol=1e-5, rtol=1e-4)
        pipeline = WanPipeline.from_pretrained(folder)
        pipeline.load_lora_weights(str(tmp_path / "adapter"))
        torch.testing.assert_close(velocity_of(pipeline.transformer, embeds), trained, atol=1e-5, rtol=1e-4)
        family.export_merged(tmp_path / "merged", folder)
        merged = DiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
        assert type(merged) is WanPipeline
        torch.testing.assert_close(velocity_of(merged.transformer, embeds), trained, atol=1e-5, rtol=1e-4)


def test_image_to_video_reproduces_the_stock_pipeline():
    family, config = load(family="wan_i2v")
    shape = family.sample_shape(config.sampling)
    image = Image.radial_gradient("L").convert("RGB").resize((32, 32))
    x = family.initial_noise(["s0", "s1"], 0, shape)
    text = family.encode(PROMPTS)
    condition = family.encode_images([image, image])
    assert condition.shape == (2, 4 + 16, 3, 4, 4)  # first-frame mask + the latents of [image, 8 black frames]
    assert condition[:, :4, 0].eq(1).all() and condition[:, :4, 1:].eq(0).all()
    cond = family.with_condition_images(text, PROMPTS, [image, image], condition)
    schedule, ours = family.schedule(3, shape), x
    with torch.no_grad():
        for index in range(3):
            ours = family.transition(ours, index, 0.0, cond, schedule).sample
    negative, positive = text["embeds"].chunk(2)  # (the stock I2V module's prompt cleaning needs ftfy: embeds given)
    stock = family.pipeline(
        image=image, prompt_embeds=positive, negative_prompt_embeds=negative, height=32, width=32, num_frames=9,
        num_inference_steps=3, guidance_scale=4.0, latents=x, output_type="latent",
    ).frames  # fmt: skip
    torch.testing.assert_close(stock, ours, atol=1e-5, rtol=0)


def test_image_to_video_rollout_carries_each_prompt_image_and_trains(tmp_path):
    from unirl_core.data.prompts import MediaRef, PromptExample

    examples = []
    for i, colour in enumerate(["red", "navy"]):
        path = tmp_path / f"cond{i}.png"
        Image.new("RGB", (48, 40), colour).save(path)
        examples.append(PromptExample("the ball rolls", f"p{i}", {}, (MediaRef("image", "condition", str(path)),)))
    config = train_config(family="wan_i2v")
    family = build_family(config.model, config.sampling)
    rollout = run_rollout(family, expand_groups(examples, 2), config.sampling, config.algorithm, seed=0)
    assert rollout.cond["condition"].shape == (8, 20, 3, 4, 4)  # CFG halves x 4 samples
    assert rollout.cond["image_embeds"].shape[0] == 8
    red, navy = (np.asarray(v.frames[0], dtype=np.float64) for v in rollout.outputs[::2])
    assert np.abs(red - navy).mean() > 1.0  # the condition image shapes the video
    metrics = TrainStack(family, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0

    plain = expand_groups(build_source(config.data).next_batch(), 2)
    with pytest.raises(ValueError, match="wan_i2v generates from a condition image"):
        run_rollout(family, plain, config.sampling, config.algorithm, seed=0)
    text_only = train_config()
    wan = build_family(text_only.model, text_only.sampling)
    with pytest.raises(ValueError, match="family 'wan' takes text only"):
        run_rollout(wan, expand_groups(examples, 2), text_only.sampling, text_only.algorithm, seed=0)


def test_wan2_2_switches_experts_where_the_stock_pipeline_does():
    family, config = load(family="wan2_2")
    shape = family.sample_shape(config.sampling)
    x, text = family.initial_noise(["s0", "s1"], 0, shape), family.encode(PROMPTS)
    calls: list[str] = []
    hooks = [getattr(family.pipeline, name).register_forward_hook(lambda *_, name=name: calls.append(name))
             for name in ("transformer", "transformer_2")]  # fmt: skip
    schedule, ours = family.schedule(4, shape), x
    with torch.no_grad():
        for index in range(4):
            ours = family.transition(ours, index, 0.0, text, schedule).sample
    ours_calls, calls[:] = list(calls), []
    negative, positive = text["embeds"].chunk(2)
    stock = family.pipeline(
        prompt_embeds=positive, negative_prompt_embeds=negative, height=32, width=32, num_frames=9,
        num_inference_steps=4, guidance_scale=4.0, latents=x, output_type="latent",
    ).frames  # fmt: skip
    for hook in hooks:
        hook.remove()
    assert schedule[1] < 0.875 <= schedule[0]  # boundary 0.875: the first step is the high-noise expert's
    assert ours_calls == ["transformer"] + ["transformer_2"] * 3  # one call per step (both CFG halves batched)
    assert list(dict.fromkeys(calls)) == ["transformer", "transformer_2"] and calls.count("transformer") == 2
    torch.testing.assert_close(stock, ours, atol=1e-5, rtol=0)


def test_wan2_2_trains_the_experts_it_is_told_to_and_exports_each(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline

    config = train_config(family="wan2_2")
    config.model.experts = ["transformer_2"]
    family = build_family(config.model, config.sampling)
    assert list(family.trainable) == ["transformer_2"] and len(family.blocks()) == 2
    frozen = {k: v.clone() for k, v in family.pipeline.transformer.state_dict().items()}
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(family, samples, config.sampling, config.algorithm, seed=0)
    metrics = TrainStack(family, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert all(torch.equal(v, family.pipeline.transformer.state_dict()[k]) for k, v in frozen.items())
    assert not hasattr(family.pipeline.transformer, "peft_config")  # no adapter on the frozen expert

    both = train_config(family="wan2_2")
    family = build_family(both.model, both.sampling)
    for parameter in family.parameters():
        parameter.data.add_(torch.randn_like(parameter) * 0.1)
    embeds = family.encode_texts(PROMPTS)["embeds"]
    with torch.no_grad():
        trained = [velocity_of(family.pipeline.transformer, embeds), velocity_of(family.pipeline.transformer_2, embeds)]
        family.export_adapter(tmp_path / "adapter", resolve_model_path(both.model.path))
        pipeline = WanPipeline.from_pretrained(resolve_model_path(both.model.path))
        pipeline.load_lora_weights(str(tmp_path / "adapter"))
        pipeline.load_lora_weights(str(tmp_path / "adapter" / "transformer_2"), load_into_transformer_2=True)
        for module, expected in zip((pipeline.transformer, pipeline.transformer_2), trained, strict=True):
            torch.testing.assert_close(velocity_of(module, embeds), expected, atol=1e-5, rtol=1e-4)
        family.export_merged(tmp_path / "merged", resolve_model_path(both.model.path))
        merged = DiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
        for module, expected in zip((merged.transformer, merged.transformer_2), trained, strict=True):
            torch.testing.assert_close(velocity_of(module, embeds), expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("family", "experts", "message"),
    [("wan", ["transformer"], "train.model.experts: ['transformer'], but wan has one denoiser: leave it empty"),
     ("wan2_2", ["transformer_3"], "train.model.experts: ['transformer_3']: name some of wan2_2's experts")],
)  # fmt: skip
def test_experts_are_checked_against_the_family(family, experts, message):
    config = train_config(family=family)
    config.model.experts = experts
    assert any(message in problem for problem in DiffusionDomain.start_problems(config))


def test_ti2v_feeds_a_timestep_per_token_as_the_stock_pipeline():
    config = train_config(family="wan_ti2v")
    config.sampling.height = config.sampling.width = 64
    config.model.lora = None
    family = build_family(config.model, config.sampling)
    shape = family.sample_shape(config.sampling)
    assert shape == (48, 3, 4, 4)  # the high-compression VAE: z_dim 48, 16x spatial
    x, text = family.initial_noise(["s0", "s1"], 0, shape), family.encode(PROMPTS)
    schedule, ours = family.schedule(3, shape), x
    with torch.no_grad():
        for index in range(3):
            ours = family.transition(ours, index, 0.0, text, schedule).sample
    negative, positive = text["embeds"].chunk(2)
    stock = family.pipeline(
        prompt_embeds=positive, negative_prompt_embeds=negative, height=64, width=64, num_frames=9,
        num_inference_steps=3, guidance_scale=4.0, latents=x, output_type="latent",
    ).frames  # fmt: skip
    assert family.pipeline.config.expand_timesteps
    torch.testing.assert_close(stock, ours, atol=1e-5, rtol=0)
    assert [len(v) for v in family.decode(ours)] == [9, 9]
