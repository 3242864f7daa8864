"""The FLUX.1 families on their tiny models (real FluxTransformer2DModel, CLIP, T5, VAE, FlowMatchEuler with
dynamic shift): our schedule + transitions reproduce the stock FluxPipeline / FluxKontextPipeline, the SDE's
log-prob is the Gaussian density, conditioning round-trips, a rollout trains, and the exports load in diffusers."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

from unirl_core.config import recipe_from_tree
from unirl_core.config.schema import WarmupConfig
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack, WarmupStack
from unirl_core.models.families.flux.family import FluxFamily, pack, unpack
from unirl_core.models.registry import build_family, family_class, resolve_model_path

pytestmark = pytest.mark.slow
PROMPTS = ["a red cube", "a blue ball"]
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_out", "norm_out.linear"]


def train_config(family: str, guidance: float = 3.5, **algorithm):
    return recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": 2},
        "sampling": {"samples_per_prompt": 2, "num_inference_steps": 3, "guidance_scale": guidance, "height": 32,
                     "width": 32},
        "model": {"family": family, "path": f"tiny:{family}", "lora": {"rank": 4, "alpha": 8, "target_modules": TARGETS}},
        "algorithm": {"eta": 0.7, "micro_batch_size": 2, "learning_rate": 0.05, **algorithm},
        "steps": 2,
    }}).train  # fmt: skip


def load(family: str, lora: bool = False, guidance: float = 3.5) -> FluxFamily:
    config = train_config(family, guidance)
    if not lora:
        config.model.lora = None
    return build_family(config.model, config.sampling)


def condition_images() -> list:
    return [Image.new("RGB", (32, 32), "red"), Image.radial_gradient("L").convert("RGB").resize((32, 32))]


def velocity_of(transformer, cond: dict) -> torch.Tensor:
    """The denoiser's output on a fixed packed input: what an exported model must reproduce."""
    x = torch.randn((1, 64, 16), generator=torch.Generator().manual_seed(3))
    return transformer(
        hidden_states=x, timestep=torch.tensor([0.6]), guidance=torch.tensor([3.5]),
        pooled_projections=cond["pooled"][:1], encoder_hidden_states=cond["embeds"][:1],
        txt_ids=torch.zeros(cond["embeds"].shape[1], 3), img_ids=torch.zeros(64, 3), return_dict=False,
    )[0]  # fmt: skip


@pytest.mark.parametrize("family", ["flux", "flux_schnell", "flux_kontext"])
def test_eta_zero_reproduces_the_stock_pipeline(family):
    adapter = load(family)
    shape = adapter.latent_shape(32, 32)
    assert shape == (4, 16, 16)  # tiny VAE: stride 2, 4 channels; 2x2 packing gives 8 x 8 tokens of 16
    x = adapter.initial_noise(["s0", "s1"], 0, shape)
    cond, extra = adapter.encode(PROMPTS), {}
    if family == "flux_kontext":
        images = condition_images()
        cond = adapter.with_condition_images(cond, PROMPTS, images, adapter.encode_images(images))
        extra = {"image": images, "_auto_resize": False, "max_area": 32 * 32}
    schedule, ours = adapter.schedule(3, shape), x
    for index in range(3):
        ours = adapter.transition(ours, index, 0.0, cond, schedule).sample
    stock = adapter.pipeline(
        prompt=PROMPTS, height=32, width=32, num_inference_steps=3, guidance_scale=3.5, latents=pack(x),
        output_type="latent", max_sequence_length=adapter.max_sequence_length, **extra,
    ).images  # fmt: skip
    scheduler = adapter.pipeline.scheduler
    assert schedule == scheduler.sigmas.tolist()  # the same shifted sigmas ...
    torch.testing.assert_close(scheduler.timesteps, scheduler.sigmas[:-1] * 1000)  # ... and timesteps
    if family == "flux_schnell":
        assert schedule == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3), 0.0]  # no shift
    else:
        assert schedule[1] > 2 / 3  # mu (64 tokens) shifts towards noise
    torch.testing.assert_close(unpack(stock, 16, 16), ours, atol=1e-5, rtol=0)


def test_packing_and_the_reference_tokens():
    x = torch.randn(2, 4, 6, 8)
    assert torch.equal(unpack(pack(x), 6, 8), x)
    from diffusers import FluxPipeline

    assert torch.equal(pack(x), FluxPipeline._pack_latents(x, 2, 4, 6, 8))
    adapter = load("flux_kontext")
    images = condition_images()
    cond = adapter.encode(PROMPTS)
    with_images = adapter.with_condition_images(cond, PROMPTS, images, adapter.encode_images(images))
    x = adapter.initial_noise(["s0", "s1"], 0, adapter.latent_shape(32, 32))
    schedule = adapter.schedule(3, x.shape[1:])
    plain = adapter.transition(x, 0, 0.0, cond, schedule).sample
    edited = adapter.transition(x, 0, 0.0, with_images, schedule).sample
    assert not torch.allclose(plain, edited)  # the condition image's tokens are attended to
    one = adapter.transition(x[1:], 0, 0.0, adapter.select(with_images, torch.tensor([1])), schedule).sample
    torch.testing.assert_close(one, edited[1:], atol=1e-6, rtol=0)  # per-sample reference rows


def test_sde_log_prob_is_the_gaussian_density():
    adapter = load("flux")
    shape = adapter.latent_shape(32, 32)
    x, cond = adapter.initial_noise(["s0", "s1"], 0, shape), adapter.encode(PROMPTS)
    schedule = adapter.schedule(4, shape)
    result = adapter.transition(x, 1, 0.7, cond, schedule, generator=torch.Generator().manual_seed(0))
    sample, mean, std = result.sample.double(), result.mean.double(), result.std.double()
    density = (-((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)).mean((1, 2, 3))
    torch.testing.assert_close(result.log_prob.double(), density, atol=1e-5, rtol=0)
    again = adapter.transition(x, 1, 0.7, cond, schedule, prev_sample=result.sample)
    torch.testing.assert_close(again.log_prob, result.log_prob, atol=1e-6, rtol=0)
    # the deterministic step is the Euler step x + (s' - s) v, the mean of the SDE moves it towards x0
    euler = adapter.transition(x, 1, 0.0, cond, schedule)
    assert euler.log_prob is None and not torch.allclose(euler.sample, result.mean)


def test_conditioning_round_trips_and_guidance_is_embedded_not_a_negative_branch():
    folder = resolve_model_path("tiny:flux")
    adapter = load("flux")
    assert not adapter.cfg and adapter.guidance_scale == 3.5
    cond = adapter.encode(PROMPTS)
    assert cond["embeds"].shape == (2, 64, 64) and cond["pooled"].shape == (2, 32)  # no negative half
    unpacked = FluxFamily.unpack_conditioning(adapter.pack_conditioning(cond), folder)
    assert all(torch.equal(unpacked[k], cond[k]) for k in cond)
    torch.testing.assert_close(adapter.encode([PROMPTS[1]])["embeds"][0], cond["embeds"][1])  # fixed length
    x = adapter.initial_noise(["s0"], 0, adapter.latent_shape(32, 32))
    schedule = adapter.schedule(3, x.shape[1:])
    low = load("flux", guidance=1.0)
    first = adapter.transition(x, 0, 0.0, adapter.select(cond, torch.tensor([0])), schedule).sample
    assert not torch.allclose(first, low.transition(x, 0, 0.0, low.encode(PROMPTS[:1]), schedule).sample)

    schnell = load("flux_schnell")
    assert schnell.encode(PROMPTS)["embeds"].shape == (2, 64, 64) and not schnell.cfg
    assert (FluxFamily.max_tokens, type(schnell).max_tokens) == (512, 256)  # capped by the tiny tokenizer's 64
    guided = schnell.transition(x, 0, 0.0, schnell.encode(PROMPTS[:1]), schedule).sample
    other = load("flux_schnell", guidance=1.0)
    assert torch.equal(guided, other.transition(x, 0, 0.0, other.encode(PROMPTS[:1]), schedule).sample)


def test_rollout_train_step_warmup_and_exports(tmp_path):
    from diffusers import DiffusionPipeline, FluxPipeline, FluxTransformer2DModel
    from peft import PeftModel

    config = train_config("flux")
    adapter = build_family(config.model, config.sampling)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    assert rollout.latents_TB.shape == (3, 4, 4, 16, 16) and torch.isfinite(rollout.logp_TB).all()
    before = [p.detach().clone() for p in adapter.parameters()]
    metrics = TrainStack(adapter, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, adapter.parameters(), strict=True))

    latents = adapter.encode_images(condition_images())
    text = adapter.encode_texts(["a red square", "stripes"])
    loss = adapter.denoising_loss(latents, text, [torch.Generator().manual_seed(s) for s in range(2)])
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in adapter.parameters())
    adapter.trainable.zero_grad()
    same = adapter.denoising_loss(latents, text, [torch.Generator().manual_seed(s) for s in range(2)])
    assert same.item() == loss.item()  # the draws come from the generators only
    warm = WarmupStack(adapter, WarmupConfig(learning_rate=1e-2), 1.0).train(
        latents, text, [torch.Generator().manual_seed(s) for s in range(2)], step=0
    )
    assert math.isfinite(warm["loss"]) and warm["grad_norm"] > 0

    folder = resolve_model_path(config.model.path)
    (tmp_path / "adapter").mkdir()
    with torch.no_grad():
        trained = velocity_of(adapter.trainable, text)
        adapter.export_adapter(tmp_path / "adapter", folder)
        base = FluxTransformer2DModel.from_pretrained(folder, subfolder="transformer")
        assert not torch.allclose(velocity_of(base, text), trained, atol=1e-4)  # training moved the output
        peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
        torch.testing.assert_close(velocity_of(peft_model, text), trained, atol=1e-5, rtol=1e-4)
        pipeline = FluxPipeline.from_pretrained(folder)  # the diffusers-format LoRA in the same folder
        pipeline.load_lora_weights(str(tmp_path / "adapter"))
        torch.testing.assert_close(velocity_of(pipeline.transformer, text), trained, atol=1e-5, rtol=1e-4)
        adapter.export_merged(tmp_path / "merged", folder)
        merged = DiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
        assert type(merged) is FluxPipeline
        torch.testing.assert_close(velocity_of(merged.transformer, text), trained, atol=1e-5, rtol=1e-4)


def test_kontext_rollout_carries_the_condition_image(tmp_path):
    from unirl_core.data.prompts import MediaRef, PromptExample
    from unirl_core.domains.diffusion.rollout.conditions import load_condition_image

    examples = []
    for i, colour in enumerate(["red", "navy"]):
        path = tmp_path / f"cond{i}.png"
        Image.new("RGB", (48, 40), colour).save(path)
        examples.append(PromptExample("make it brighter", f"p{i}", {}, (MediaRef("image", "condition", str(path)),)))
    config = train_config("flux_kontext")
    adapter = build_family(config.model, config.sampling)
    assert family_class("flux_kontext").condition_mode == "reference"
    samples = expand_groups(examples, 2)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    assert rollout.steps == [0, 1, 2]  # denoised from noise, every step trained
    expected = adapter.encode_images(
        [load_condition_image(str(tmp_path / f"cond{i}.png"), 32, 32) for i in (0, 0, 1, 1)]
    )
    torch.testing.assert_close(rollout.cond["reference"], expected)
    first_red, first_navy = (torch.tensor(list(im.getdata()), dtype=torch.float) for im in rollout.images[::2])
    assert not torch.equal(first_red, first_navy)  # the condition image shapes the result
    metrics = TrainStack(adapter, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0


def test_registry_lora_targets_and_published_configs():
    from diffusers import FluxTransformer2DModel

    for name in ("flux", "flux_schnell", "flux_kontext"):
        cls = family_class(name)
        assert cls.latent_stride == 16 and "attn.add_q_proj" in cls.lora_targets
        for variant, kwargs in cls.denoiser_configs.items():
            with torch.device("meta"):
                model = FluxTransformer2DModel(**kwargs)
            billions = sum(p.numel() for p in model.parameters()) / 1e9
            assert 11.8 < billions < 12.0, (variant, billions)  # FLUX.1's 12B transformer
            assert model.config.guidance_embeds == (variant != "flux1-schnell")
