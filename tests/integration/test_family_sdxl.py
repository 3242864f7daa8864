"""The sdxl family against the stock StableDiffusionXLPipeline on the tiny SDXL: the same DDIM trajectory, the
same CFG halves (zeros for no negative prompt), log-probs that are the Gaussian's, a train and a warm-up step, and
exports that stock diffusers loads back."""

from __future__ import annotations

import image_cases as cases
import pytest
import torch

from unirl_core.config import load_recipe
from unirl_core.config.schema import WarmupConfig
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.rollout.samplers import LOG_SQRT_2PI
from unirl_core.domains.diffusion.stack import TrainStack, WarmupStack
from unirl_core.models.families.sdxl.family import SDXLFamily
from unirl_core.models.registry import build_family, resolve_model_path, write_tiny_model

PROMPTS = ["a red cube", "a blue ball"]
TARGETS = "[to_q,to_k,to_v,to_out.0,proj_out,conv_out]"  # the tiny's attention alone moves the image too little
SMALL = [
    "train.model.family=sdxl",
    "train.model.path=tiny:sdxl",
    f"train.model.lora.target_modules={TARGETS}",
    "train.data.prompts_per_rollout=2",
    "train.sampling.samples_per_prompt=2",
    "train.sampling.num_inference_steps=3",
    "train.sampling.guidance_scale=3.0",
    "train.algorithm.eta=1.0",
    "train.algorithm.micro_batch_size=2",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny model's ops are too small to share among threads: on a busy 2-core machine a second thread waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder() -> str:
    return resolve_model_path("tiny:sdxl")


@pytest.fixture(scope="module")
def pipe(folder):
    from diffusers import DDIMScheduler, StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(folder)
    pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)  # how diffusers swaps in DDIM
    pipe.set_progress_bar_config(disable=True)
    return pipe


def unet_output(unet, cond: dict) -> torch.Tensor:
    """The UNet's epsilon on a fixed input (32 x 32 px): what an exported model must reproduce."""
    x = torch.randn((1, 4, 16, 16), generator=torch.Generator().manual_seed(3))
    time_ids = torch.tensor([[32.0, 32.0, 0.0, 0.0, 32.0, 32.0]])
    added = {"text_embeds": cond["pooled"][:1], "time_ids": time_ids}
    return unet(x, torch.tensor([500]), encoder_hidden_states=cond["embeds"][:1], added_cond_kwargs=added).sample


@pytest.mark.parametrize("negative", ["", "blurry"])
@torch.no_grad()
def test_eta_zero_reproduces_the_stock_pipeline_with_ddim(folder, pipe, negative):
    """32 x 48 px (time ids (32, 48, 0, 0, 32, 48)), CFG 5; "" is the pipeline called without a negative prompt."""
    family = SDXLFamily(folder, guidance_scale=5.0, negative_prompt=negative)
    shape = family.latent_shape(32, 48)
    noise = family.initial_noise(["a", "b"], 0, shape)
    schedule = family.schedule(4, shape)
    assert schedule == [751, 501, 251, 1, -1]  # leading spacing, steps_offset 1
    x = noise
    for index in range(4):
        x = family.transition(x, index, 0.0, family.encode(PROMPTS), schedule).sample
    stock = pipe(
        PROMPTS, negative_prompt=negative or None, height=32, width=48, num_inference_steps=4, guidance_scale=5.0,
        latents=noise.clone(), output_type="latent",
    ).images  # fmt: skip
    assert pipe.scheduler.timesteps.tolist() == schedule[:-1] and pipe.scheduler.init_noise_sigma == 1.0
    assert x.abs().max() > 1.0 and (x - stock).abs().max() < 1e-4  # measured 4.8e-6
    torch.testing.assert_close(x, stock, atol=1e-4, rtol=1e-5)


@torch.no_grad()
def test_log_prob_is_the_gaussian_density_and_re_evaluates(folder):
    family = SDXLFamily(folder, guidance_scale=3.0)
    cond, shape = family.encode(PROMPTS), family.latent_shape(32, 32)
    schedule = family.schedule(3, shape)
    x = family.initial_noise(["a", "b"], 1, shape)
    step = family.transition(x, 1, 1.0, cond, schedule, generator=torch.Generator().manual_seed(0))
    sample, mean, std = step.sample.double(), step.mean.double(), step.std.double()
    expected = (-((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - LOG_SQRT_2PI).mean(dim=(1, 2, 3))
    assert std > 0 and torch.allclose(step.log_prob.double(), expected, atol=1e-5, rtol=0)
    again = family.transition(x, 1, 1.0, cond, schedule, prev_sample=step.sample)
    assert torch.equal(again.log_prob, step.log_prob)


@torch.no_grad()
def test_conditioning_matches_encode_prompt_and_packs_losslessly(folder, pipe):
    family = SDXLFamily(folder, guidance_scale=5.0)
    cond = family.encode(PROMPTS)  # [negative, positive]
    embeds, negative_embeds, pooled, negative_pooled = pipe.encode_prompt(PROMPTS, device="cpu")
    assert cond["embeds"].shape == (4, 77, 64) and cond["pooled"].shape == (4, 32)
    torch.testing.assert_close(cond["embeds"], torch.cat([negative_embeds, embeds]), atol=1e-6, rtol=0)
    torch.testing.assert_close(cond["pooled"], torch.cat([negative_pooled, pooled]), atol=1e-6, rtol=0)
    assert not cond["embeds"][:2].any() and not cond["pooled"][:2].any()  # force_zeros_for_empty_prompt

    unpacked = SDXLFamily.unpack_conditioning(family.pack_conditioning(cond), folder)
    assert unpacked.keys() == cond.keys() and all(torch.equal(unpacked[k], cond[k]) for k in cond)
    texts = family.encode_texts([""])
    assert texts["embeds"].any()  # "" as a prompt is encoded: only the negative half is zeroed

    clean, noise = torch.randn((2, 1, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    schedule = family.schedule(4, (4, 8, 8))  # image-to-image starts from the noised image at a schedule step
    expected = pipe.scheduler.add_noise(clean, noise, torch.tensor([schedule[2]]))
    torch.testing.assert_close(family.noised(clean, noise, 2, schedule), expected, atol=1e-6, rtol=1e-6)


def test_the_real_unet_config_builds_on_the_meta_device():
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(SDXLFamily.denoiser_configs["sdxl-base-1.0"])
    assert sum(p.numel() for p in unet.parameters()) == 2_567_463_684  # SDXL base's 2.6 B
    assert unet.add_embedding.linear_1.in_features == 1280 + 6 * 256


@torch.no_grad()
def test_a_float16_model_decodes_in_float32(folder):
    half, full = SDXLFamily(folder, dtype="float16"), SDXLFamily(folder)
    assert half.trainable.dtype == torch.float16 and half.pipeline.vae.dtype == torch.float32
    latents = torch.randn((1, 4, 16, 16), generator=torch.Generator().manual_seed(0))
    pixels = [torch.tensor(list(f.decode(latents)[0].getdata()), dtype=torch.float) for f in (half, full)]
    assert (pixels[0] - pixels[1]).abs().max() <= 1  # the float16-rounded weights: one level at most


def test_rollout_train_step_warmup_step_and_exports(folder, tmp_path):
    from diffusers import DiffusionPipeline, StableDiffusionXLPipeline, UNet2DConditionModel
    from peft import PeftModel

    config = load_recipe("demo", SMALL).train
    adapter = build_family(config.model, config.sampling)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    assert rollout.latents_TB.shape == (3, 4, 4, 16, 16) and len(rollout.images) == 4
    assert torch.isfinite(rollout.logp_TB).all()
    before = [p.detach().clone() for p in adapter.parameters()]
    metrics = TrainStack(adapter, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, adapter.parameters(), strict=True))

    latents = adapter.encode_images([cases.procedural(32, 32, seed=s) for s in range(2)])
    cond = adapter.encode_texts(["a red square", "stripes"])
    stack = WarmupStack(adapter, WarmupConfig(learning_rate=1e-2), config.algorithm.max_grad_norm)
    warm = stack.train(latents, cond, [torch.Generator().manual_seed(s) for s in range(2)], step=0)
    assert torch.isfinite(torch.tensor(warm["loss"])) and warm["grad_norm"] > 0

    (tmp_path / "adapter").mkdir()
    with torch.no_grad():
        trained = unet_output(adapter.trainable, cond)
        adapter.export_adapter(tmp_path / "adapter", folder)
        base = UNet2DConditionModel.from_pretrained(folder, subfolder="unet")
        assert not torch.allclose(unet_output(base, cond), trained)  # the training moved the output
        peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
        torch.testing.assert_close(unet_output(peft_model, cond), trained, atol=1e-5, rtol=1e-4)
        stock = StableDiffusionXLPipeline.from_pretrained(folder)
        stock.load_lora_weights(str(tmp_path / "adapter"))  # diffusers' pytorch_lora_weights.safetensors
        torch.testing.assert_close(unet_output(stock.unet, cond), trained, atol=1e-5, rtol=1e-4)
        adapter.export_merged(tmp_path / "merged", folder)
        merged = DiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
        assert type(merged.scheduler).__name__ == "EulerDiscreteScheduler"  # the stock sampler is kept
        torch.testing.assert_close(unet_output(merged.unet, cond), trained, atol=1e-5, rtol=1e-4)


def test_v_prediction_is_refused(tmp_path):
    import json

    folder = write_tiny_model(tmp_path / "vpred", "sdxl")
    path = folder / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "prediction_type": "v_prediction"}))
    with pytest.raises(ValueError, match="prediction_type='v_prediction'.*epsilon prediction only"):
        SDXLFamily(str(folder))
