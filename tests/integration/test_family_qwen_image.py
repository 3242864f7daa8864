"""The qwen_image family on the tiny QwenImagePipeline (real classes, random weights): our sampler reproduces the
stock pipeline, the SDE's log-prob is the Gaussian density, the conditioning round-trips, an RL step and a warm-up
step train the LoRA, and both exports load in stock diffusers with the trained output."""

from __future__ import annotations

import math

import image_cases as cases
import pytest
import torch

from unirl_core.config import recipe_from_tree
from unirl_core.config.schema import WarmupConfig
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack, WarmupStack
from unirl_core.models.families.qwen_image.family import QwenImageFamily, pack, unpack
from unirl_core.models.registry import build_family, resolve_model_path

PROMPTS = ["a red cube", "a much longer prompt: two blue balls on a wooden table"]


def config(guidance_scale: float = 4.0):
    return recipe_from_tree({
        "train": {
            "data": {"source": "smoke", "prompts_per_rollout": 2},
            "sampling": {
                "samples_per_prompt": 2, "num_inference_steps": 3, "guidance_scale": guidance_scale,
                "negative_prompt": " ", "height": 32, "width": 32,
            },
            "model": {
                "family": "qwen_image", "path": "tiny:qwen_image",
                "lora": {"rank": 4, "alpha": 8, "target_modules": list(QwenImageFamily.lora_targets)},
            },
            "algorithm": {"eta": 1.0, "micro_batch_size": 2, "learning_rate": 0.05},
            "steps": 1,
        }
    }).train  # fmt: skip


def denoise(transformer, cond: dict, rows: int = 1) -> torch.Tensor:
    """A denoiser's packed output on a fixed input (the first `rows` texts of `cond`): what an exported model must
    reproduce."""
    x = torch.randn((rows, 64, 16), generator=torch.Generator().manual_seed(3))
    return transformer(
        hidden_states=x, timestep=torch.full((rows,), 0.5), encoder_hidden_states=cond["embeds"][:rows],
        encoder_hidden_states_mask=cond["mask"][:rows], img_shapes=[[(1, 8, 8)]] * rows, return_dict=False,
    )[0]  # fmt: skip


@pytest.mark.parametrize("guidance_scale", [4.0, 1.0])
def test_eta_zero_reproduces_the_stock_pipeline(guidance_scale):
    """Same noise, same sigmas (dynamic shift from 64 image tokens, terminal stretch), true CFG with the norm
    rescale, two prompts of different lengths (the pipeline pads to the longer, we pad both to 512)."""
    train = config(guidance_scale)
    adapter = build_family(train.model.model_copy(update={"lora": None}), train.sampling)
    shape = adapter.latent_shape(32, 32)
    schedule = adapter.schedule(4, shape)
    x0 = torch.randn((2, *shape), generator=torch.Generator().manual_seed(0))
    stock = adapter.pipeline(
        PROMPTS, negative_prompt=" " if adapter.cfg else None, true_cfg_scale=guidance_scale, height=32, width=32,
        num_inference_steps=4, latents=pack(x0), output_type="latent",
    ).images  # fmt: skip
    assert schedule == [float(s) for s in adapter.pipeline.scheduler.sigmas] and schedule[0] == 1.0
    assert math.isclose(schedule[-2], 0.02, rel_tol=1e-5)  # shift_terminal
    cond, x = adapter.encode(PROMPTS), x0
    with torch.no_grad():
        for index in range(4):
            x = adapter.transition(x, index, 0.0, cond, schedule).sample
    torch.testing.assert_close(x, unpack(stock.float(), 16, 16), atol=1e-5, rtol=0)
    assert not torch.allclose(x[0], x[1], atol=1e-3)


def test_sde_log_prob_is_the_gaussian_density_and_reevaluates():
    train = config()
    adapter = build_family(train.model, train.sampling)
    shape = adapter.latent_shape(32, 32)
    schedule, cond = adapter.schedule(3, shape), adapter.encode(PROMPTS)
    x = torch.randn((2, *shape), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        step = adapter.transition(x, 1, 0.8, cond, schedule, generator=torch.Generator().manual_seed(2))
        again = adapter.transition(x, 1, 0.8, cond, schedule, prev_sample=step.sample)
    sample, mean, std = step.sample.double(), step.mean.double(), step.std.double()
    density = (-((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)).mean((1, 2, 3))
    assert std.item() > 0 and step.log_prob.shape == (2,)
    torch.testing.assert_close(step.log_prob.double(), density, atol=1e-5, rtol=0)
    torch.testing.assert_close(again.log_prob, step.log_prob, atol=0, rtol=0)


def test_conditioning_packs_round_trip_and_cfg_puts_the_negative_first():
    train = config()
    adapter = build_family(train.model, train.sampling)
    texts = adapter.encode_texts(PROMPTS)
    assert texts["embeds"].shape == (2, 512, 32) and texts["mask"].dtype == torch.long
    lengths = texts["mask"].sum(1)
    assert lengths[1] > lengths[0] and not texts["embeds"][0, lengths[0] :].any()  # zero padding, mask 0
    folder = resolve_model_path("tiny:qwen_image")
    unpacked = QwenImageFamily.unpack_conditioning(adapter.pack_conditioning(texts), folder)
    assert all(torch.equal(unpacked[k], texts[k]) for k in texts)
    cond = adapter.encode(PROMPTS)
    negative = adapter.encode_texts([" "])
    for key in ("embeds", "mask"):
        assert torch.equal(cond[key][:2], negative[key].expand_as(texts[key]))
        assert torch.equal(cond[key][2:], texts[key])
    assert adapter.text_identity()["max_sequence_length"] == 512
    # the padding is exact: the full 512-token padding gives the output of the batch trimmed to its longest text
    with torch.no_grad():
        padded = denoise(adapter.trainable, texts, rows=2)
        trimmed = denoise(adapter.trainable, {k: v[:, : int(lengths.max())] for k, v in texts.items()}, rows=2)
    torch.testing.assert_close(padded, trimmed, atol=1e-6, rtol=0)


def test_rl_step_warmup_step_and_exports_load_in_stock_diffusers(tmp_path):
    from diffusers import DiffusionPipeline, QwenImagePipeline

    train = config()
    adapter = build_family(train.model, train.sampling)
    samples = expand_groups(build_source(train.data).next_batch(), train.sampling.samples_per_prompt)
    rollout = run_rollout(adapter, samples, train.sampling, train.algorithm, seed=0)
    assert rollout.latents_TB.shape == (3, 4, 4, 16, 16) and len(rollout.images) == 4
    assert torch.isfinite(rollout.logp_TB).all()
    before = [p.detach().clone() for p in adapter.parameters()]
    metrics = TrainStack(adapter, train.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, adapter.parameters(), strict=True))

    latents = adapter.encode_images([cases.procedural(32, 32, seed=s) for s in range(2)])
    assert latents.shape == (2, 4, 16, 16)
    cond = adapter.encode_texts(PROMPTS)
    stack = WarmupStack(adapter, WarmupConfig(learning_rate=1e-2), train.algorithm.max_grad_norm)
    warm = stack.train(latents, cond, [torch.Generator().manual_seed(s) for s in range(2)], step=0)
    assert math.isfinite(warm["loss"]) and warm["grad_norm"] > 0

    folder = resolve_model_path(train.model.path)
    (tmp_path / "adapter").mkdir()
    with torch.no_grad():
        trained = denoise(adapter.trainable, cond)
        adapter.export_adapter(tmp_path / "adapter", folder)
        stock = QwenImagePipeline.from_pretrained(folder)
        assert not torch.allclose(denoise(stock.transformer, cond), trained, atol=1e-4)  # training moved it
        stock.load_lora_weights(str(tmp_path / "adapter"))
        torch.testing.assert_close(denoise(stock.transformer, cond), trained, atol=1e-5, rtol=1e-4)
        adapter.export_merged(tmp_path / "merged", folder)
        merged = DiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
        assert type(merged) is QwenImagePipeline
        torch.testing.assert_close(denoise(merged.transformer, cond), trained, atol=1e-5, rtol=1e-4)


def test_vae_scaling_inverts_exactly():
    """decode(encode_images(x)) is the VAE's own unscaled round trip: the per-channel (mean, std) normalization and
    the frame axis cancel (a random tiny VAE does not reconstruct, so the comparison is with the raw VAE)."""
    import numpy as np

    train = config(1.0)
    adapter = build_family(train.model.model_copy(update={"lora": None}), train.sampling)
    images = [cases.procedural(32, 32, seed=s) for s in range(2)]
    latents = adapter.encode_images(images)
    assert latents.shape == (2, 4, 16, 16)
    vae, processor = adapter.pipeline.vae, adapter.pipeline.image_processor
    with torch.no_grad():
        raw = vae.decode(vae.encode(processor.preprocess(images)[:, :, None]).latent_dist.mode()).sample[:, :, 0]
    ours = np.stack([np.asarray(i, dtype=np.int16) for i in adapter.decode(latents)])
    theirs = np.stack([np.asarray(i, dtype=np.int16) for i in processor.postprocess(raw, output_type="pil")])
    assert np.abs(ours - theirs).max() <= 1
