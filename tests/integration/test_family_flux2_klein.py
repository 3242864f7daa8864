"""FLUX.2-Klein on the tiny Flux2KleinPipeline (real classes, random weights): our schedule + transition loop is the
stock pipeline's sampler (base with true CFG, distilled without, edit with a reference image), the SDE log-prob is
a Gaussian density, the conditioning packs exactly, and a rollout trains, warms up and exports to files the stock
pipeline loads."""

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
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack, WarmupStack
from unirl_core.models.families.flux2_klein.family import Flux2KleinFamily, pack, unpack
from unirl_core.models.registry import build_family, resolve_model_path

pytestmark = pytest.mark.slow
PROMPTS = ["a red cube on a table", "stripes"]
SIZE = 32  # pixels: the tiny VAE's stride 2 x patchify 2 -> 8 x 8 tokens of 8 channels


@pytest.fixture(scope="module")
def folder() -> str:
    return resolve_model_path("tiny:flux2_klein")


def stock(folder: str, distilled: bool = False):
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(folder)
    pipe.register_to_config(is_distilled=distilled)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def our_loop(adapter, x, cond, num_steps: int) -> tuple[torch.Tensor, list[float]]:
    schedule = adapter.schedule(num_steps, tuple(x.shape[1:]))
    for index in range(num_steps):
        x = adapter.transition(x, index, 0.0, cond, schedule).sample
    return x, schedule


@pytest.mark.parametrize("variant", ["base_cfg", "distilled", "edit"])
@torch.no_grad()
def test_our_sampler_is_the_stock_pipeline(folder, variant):
    """Same initial noise (the pipeline's own noise space) -> the same latents, sigmas and decoded images."""
    adapter = Flux2KleinFamily(folder, guidance_scale=4.0)
    pipe = stock(folder, distilled=variant == "distilled")
    adapter.pipeline.register_to_config(is_distilled=variant == "distilled")
    assert adapter.cfg == (variant != "distilled")  # distilled Klein ignores guidance_scale, as its pipeline does
    shape = adapter.latent_shape(SIZE, SIZE)
    assert shape == (8, 8, 8)
    x = adapter.initial_noise(["a", "b"], seed=0, shape=shape)
    cond, extra = adapter.encode(PROMPTS), {}
    if variant == "edit":
        # the pipeline wants condition images of at least 64 px; it shares its reference image across the batch
        image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
        reference = [image, image]
        cond = adapter.with_condition_images(cond, PROMPTS, reference, adapter.encode_images(reference))
        extra = {"image": image}
    ours, schedule = our_loop(adapter, x, cond, num_steps=4)
    kwargs = dict(prompt=PROMPTS, height=SIZE, width=SIZE, num_inference_steps=4, guidance_scale=4.0, latents=x,
                  max_sequence_length=adapter.max_sequence_length)  # fmt: skip
    theirs = pipe(**kwargs, **extra, output_type="latent").images
    torch.testing.assert_close(torch.tensor(schedule), pipe.scheduler.sigmas, atol=0, rtol=0)
    torch.testing.assert_close(torch.tensor(schedule[:-1]) * 1000, pipe.scheduler.timesteps, atol=1e-4, rtol=0)
    diff = (adapter.latents_to_vae(ours) - theirs).abs().max().item()
    assert diff < 1e-5, diff
    # the pipeline's output_type="np" tail on its latents
    images = pipe.image_processor.postprocess(pipe.vae.decode(theirs, return_dict=False)[0], output_type="np")
    decoded = np.stack([np.asarray(image, dtype=np.float32) / 255 for image in adapter.decode(ours)])
    assert np.abs(decoded - images).max() <= 1 / 255 + 1e-6


def test_vae_encoding_and_dynamic_shift_follow_the_pipeline(folder):
    """encode_images = the pipeline's `_encode_vae_image` (mode, patchify, bn-normalize); mu grows with the size."""
    adapter = Flux2KleinFamily(folder, guidance_scale=1.0)
    pipe = adapter.pipeline
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8))
    theirs = pipe._encode_vae_image(pipe.image_processor.preprocess(image), generator=None)
    torch.testing.assert_close(adapter.encode_images([image]), theirs.float(), atol=1e-6, rtol=0)
    x = torch.randn(2, 8, 4, 4)
    torch.testing.assert_close(adapter.latents_from_vae(adapter.latents_to_vae(x)), x, atol=1e-5, rtol=0)
    from unirl_core.precache.encoders import PipelineImageEncoder, PipelinePromptEncoder

    precached = PipelineImageEncoder(folder, "flux2_klein").encode(pipe.image_processor.preprocess(image))
    torch.testing.assert_close(precached, theirs.float(), atol=1e-6, rtol=0)  # precache = the loop's latent space
    packed = PipelinePromptEncoder(folder, "flux2_klein").encode(PROMPTS)
    torch.testing.assert_close(packed, adapter.encode_texts(PROMPTS)["embeds"], atol=1e-6, rtol=0)
    small, large = adapter.schedule(4, (8, 8, 8)), adapter.schedule(4, (8, 64, 64))
    assert small[0] == large[0] == 1.0 and all(a < b for a, b in zip(small[1:-1], large[1:-1], strict=True))


def test_the_sde_log_prob_is_the_gaussian_density(folder):
    adapter = Flux2KleinFamily(folder, guidance_scale=4.0)
    x = adapter.initial_noise(["a", "b"], seed=1, shape=adapter.latent_shape(SIZE, SIZE))
    cond, schedule = adapter.encode(PROMPTS), adapter.schedule(4, tuple(x.shape[1:]))
    with torch.no_grad():
        step = adapter.transition(x, 1, 0.7, cond, schedule, generator=torch.Generator().manual_seed(0))
        again = adapter.transition(x, 1, 0.7, cond, schedule, prev_sample=step.sample)
    sample, mean, std = step.sample.double(), step.mean.double(), step.std.double()
    density = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(step.log_prob.double(), density.mean(dim=(1, 2, 3)), atol=1e-5, rtol=0)
    torch.testing.assert_close(again.log_prob, step.log_prob, atol=0, rtol=0)
    assert float(std) > 0


def test_conditioning_is_fixed_shape_packs_exactly_and_puts_the_negative_first(folder):
    adapter = Flux2KleinFamily(folder, guidance_scale=4.0)
    cond = adapter.encode_texts(PROMPTS)
    assert adapter.max_sequence_length == 96  # the tiny tokenizer's model_max_length caps the pipeline's 512
    assert set(cond) == {"embeds"} and cond["embeds"].shape == (2, 96, 3 * 32)  # 96 tokens x layers (9, 18, 27)
    alone = adapter.encode_texts([PROMPTS[1]])["embeds"][0]  # the text cache encodes prompts one by one
    torch.testing.assert_close(alone, cond["embeds"][1], atol=1e-5, rtol=1e-5)
    unpacked = Flux2KleinFamily.unpack_conditioning(adapter.pack_conditioning(cond), folder)
    assert torch.equal(unpacked["embeds"], cond["embeds"])
    both = adapter.encode(PROMPTS)["embeds"]
    negative = adapter.encode_texts([""])["embeds"]
    torch.testing.assert_close(both[:2], negative.expand(2, -1, -1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both[2:], cond["embeds"], atol=1e-5, rtol=1e-5)
    x = torch.randn(2, 8, 3, 5)
    assert torch.equal(unpack(pack(x), 3, 5), x)


def train_config(**sampling):
    return recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": 2},
        "sampling": {"samples_per_prompt": 2, "num_inference_steps": 3, "guidance_scale": 3.0, "height": SIZE,
                     "width": SIZE, **sampling},
        "model": {"family": "flux2_klein", "path": "tiny:flux2_klein",
                  "lora": {"rank": 4, "alpha": 8, "target_modules": list(Flux2KleinFamily.lora_targets)}},
        "algorithm": {"eta": 1.0, "micro_batch_size": 2, "learning_rate": 0.05},
        "steps": 2,
    }}).train  # fmt: skip


def velocity(transformer, cond: dict) -> torch.Tensor:
    """The denoiser's output on a fixed input: what an exported model must reproduce."""
    from diffusers import Flux2KleinPipeline as P

    x = torch.randn((1, 8, 8, 8), generator=torch.Generator().manual_seed(3))
    embeds = cond["embeds"][:1]
    return transformer(
        hidden_states=pack(x), timestep=torch.tensor([0.6]), guidance=None, encoder_hidden_states=embeds,
        txt_ids=P._prepare_text_ids(embeds), img_ids=P._prepare_latent_ids(x), return_dict=False,
    )[0]  # fmt: skip


def test_rollout_rl_step_warmup_step_and_exports(folder, tmp_path):
    from diffusers import DiffusionPipeline

    config = train_config()
    adapter = build_family(config.model, config.sampling)
    assert type(adapter) is Flux2KleinFamily and adapter.cfg
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    assert rollout.latents_TB.shape == (3, 4, 8, 8, 8) and len(rollout.images) == 4
    assert rollout.images[0].size == (SIZE, SIZE) and torch.isfinite(rollout.logp_TB).all()

    before = [p.detach().clone() for p in adapter.parameters()]
    metrics = TrainStack(adapter, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, adapter.parameters(), strict=True))

    images = [Image.fromarray(np.random.default_rng(s).integers(0, 255, (SIZE, SIZE, 3), dtype=np.uint8))
              for s in range(2)]  # fmt: skip
    latents, cond = adapter.encode_images(images), adapter.encode_texts(PROMPTS)
    stack = WarmupStack(adapter, WarmupConfig(learning_rate=1e-2), config.algorithm.max_grad_norm)
    warm = stack.train(latents, cond, [torch.Generator().manual_seed(s) for s in range(2)], step=0)
    assert math.isfinite(warm["loss"]) and warm["grad_norm"] > 0

    (tmp_path / "adapter").mkdir()
    with torch.no_grad():
        trained = velocity(adapter.trainable, cond)
        adapter.export_adapter(tmp_path / "adapter", folder)
        pipe = stock(folder)
        assert not torch.allclose(velocity(pipe.transformer, cond), trained, atol=1e-4)  # training moved it
        pipe.load_lora_weights(str(tmp_path / "adapter"))
        torch.testing.assert_close(velocity(pipe.transformer, cond), trained, atol=1e-5, rtol=1e-4)
        adapter.export_merged(tmp_path / "merged", folder)
        merged = DiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
        assert type(merged).__name__ == "Flux2KleinPipeline"
        torch.testing.assert_close(velocity(merged.transformer, cond), trained, atol=1e-5, rtol=1e-4)


def test_an_edit_rollout_carries_the_condition_image(folder, tmp_path):
    from unirl_core.data.prompts import MediaRef, PromptExample
    from unirl_core.domains.diffusion.rollout.conditions import load_condition_image

    examples = []
    for i, colour in enumerate(["red", "blue"]):
        path = tmp_path / f"cond{i}.png"
        Image.new("RGB", (48, 40), colour).save(path)
        examples.append(PromptExample("make it brighter", f"p{i}", {}, (MediaRef("image", "condition", str(path)),)))
    config = train_config(guidance_scale=1.0)
    adapter = build_family(config.model, config.sampling)
    assert adapter.condition_mode == "reference" and not adapter.cfg
    samples = expand_groups(examples, 2)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    loaded = [load_condition_image(str(tmp_path / f"cond{i}.png"), SIZE, SIZE) for i in (0, 0, 1, 1)]
    torch.testing.assert_close(rollout.cond["reference"], adapter.encode_images(loaded), atol=1e-4, rtol=0)
    assert torch.isfinite(rollout.logp_TB).all() and len(rollout.images) == 4
    x, text_only = rollout.latents_TB[0], {"embeds": rollout.cond["embeds"]}
    with torch.no_grad():
        edited = adapter.transition(x, 0, 0.0, rollout.cond, rollout.schedule).sample
        unconditioned = adapter.transition(x, 0, 0.0, text_only, rollout.schedule).sample
    assert not torch.allclose(edited, unconditioned, atol=1e-4)  # the reference tokens enter the denoiser


def test_the_published_denoiser_configs_build_the_named_sizes():
    """`denoiser_configs` are valid Flux2Transformer2DModel kwargs of about 4 B and 9 B parameters (meta device)."""
    from diffusers import Flux2Transformer2DModel

    sizes = {}
    for variant, config in Flux2KleinFamily.denoiser_configs.items():
        with torch.device("meta"):
            sizes[variant] = sum(p.numel() for p in Flux2Transformer2DModel(**config).parameters()) / 1e9
    assert 3.8 < sizes["flux2-klein-4b"] == sizes["flux2-klein-base-4b"] < 4.0
    assert 9.0 < sizes["flux2-klein-9b"] == sizes["flux2-klein-base-9b"] < 9.2
