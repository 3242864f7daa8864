"""The qwen_image_edit family on the tiny QwenImageEditPipeline: with the condition image in the VLM prompt and as
reference tokens, our sampler reproduces the stock pipeline, and a rollout reads condition images from PNG files
and trains."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from unirl_core.config import recipe_from_tree
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.prompts import MediaRef, PromptExample
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack
from unirl_core.models.families.qwen_image.family import QwenImageEditFamily, pack, unpack
from unirl_core.models.registry import build_family


def config():
    return recipe_from_tree({
        "train": {
            "data": {"source": "smoke", "prompts_per_rollout": 2},
            "sampling": {
                "samples_per_prompt": 2, "num_inference_steps": 3, "guidance_scale": 4.0, "negative_prompt": " ",
                "height": 32, "width": 32,
            },
            "model": {
                "family": "qwen_image_edit", "path": "tiny:qwen_image_edit",
                "lora": {"rank": 4, "alpha": 8, "target_modules": list(QwenImageEditFamily.lora_targets)},
            },
            "algorithm": {"eta": 1.0, "micro_batch_size": 2, "learning_rate": 0.05},
            "steps": 1,
        }
    }).train  # fmt: skip


@pytest.fixture
def stock_resize_is_identity(monkeypatch):
    """The stock edit pipeline resizes the condition to a 1024^2 area; at 32 x 32 (the tiny model's size, which
    Flow-GRPO's trainer also does: its condition area is the training resolution's) the resize is the identity."""
    import diffusers.pipelines.qwenimage.pipeline_qwenimage_edit as edit

    original = edit.calculate_dimensions
    monkeypatch.setattr(edit, "calculate_dimensions", lambda area, ratio: original(32 * 32, ratio))


def test_eta_zero_reproduces_the_stock_edit_pipeline(stock_resize_is_identity):
    train = config()
    adapter = build_family(train.model.model_copy(update={"lora": None}), train.sampling)
    images = [Image.new("RGB", (32, 32), colour) for colour in ("red", "navy")]
    prompts = ["make it brighter", "turn the square into a long blue stripe"]
    shape = adapter.latent_shape(32, 32)
    x0 = torch.randn((2, *shape), generator=torch.Generator().manual_seed(0))
    latents = adapter.encode_images(images)
    with torch.no_grad():  # the stock edit pipeline's VAE encoding of its condition image
        pixels = adapter.pipeline.image_processor.preprocess(images, 32, 32)[:, :, None]
        torch.testing.assert_close(latents, adapter.pipeline._encode_vae_image(pixels, None)[:, :, 0], atol=0, rtol=0)
    cond = adapter.with_condition_images(adapter.encode(prompts), prompts, images, latents)
    assert cond["reference"].shape == (4, *shape) and cond["embeds"].shape[0] == 4
    schedule, x = adapter.schedule(3, shape), x0
    with torch.no_grad():
        for index in range(3):
            x = adapter.transition(x, index, 0.0, cond, schedule).sample
    for i in range(2):  # the stock pipeline takes one condition image per call
        stock = adapter.pipeline(
            image=images[i], prompt=prompts[i], negative_prompt=" ", true_cfg_scale=4.0, height=32, width=32,
            num_inference_steps=3, latents=pack(x0[i : i + 1]), output_type="latent",
        ).images  # fmt: skip
        torch.testing.assert_close(x[i : i + 1], unpack(stock.float(), 16, 16), atol=1e-5, rtol=0)
    assert schedule == [float(s) for s in adapter.pipeline.scheduler.sigmas]


def test_rollout_reads_condition_pngs_into_the_conditioning_and_trains(tmp_path):
    train = config()
    adapter = build_family(train.model, train.sampling)
    examples = []
    for i, colour in enumerate(["red", "navy"]):
        Image.new("RGB", (48, 40), colour).save(tmp_path / f"cond{i}.png")
        ref = MediaRef("image", "condition", str(tmp_path / f"cond{i}.png"))
        examples.append(PromptExample("make it brighter", f"p{i}", {}, (ref,)))
    samples = expand_groups(examples, 2)
    rollout = run_rollout(adapter, samples, train.sampling, train.algorithm, seed=0)
    reference = rollout.cond["reference"]
    assert reference.shape == (8, 4, 16, 16)  # [negative; positive] x 4 samples
    assert torch.equal(reference[:4], reference[4:]) and not torch.equal(reference[0], reference[2])
    # the VLM read the image: same prompt, different condition image -> different text conditioning
    assert not torch.equal(rollout.cond["embeds"][4], rollout.cond["embeds"][6])
    assert torch.isfinite(rollout.logp_TB).all() and len(rollout.images) == 4
    before = [p.detach().clone() for p in adapter.parameters()]
    metrics = TrainStack(adapter, train.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, adapter.parameters(), strict=True))
