"""The HunyuanVideo 1.5 family on its tiny model (real HunyuanVideo15Transformer3DModel, AutoencoderKLHunyuanVideo15,
Qwen2.5-VL text model, ByT5-style T5 glyph encoder, FlowMatchEuler, the ClassifierFreeGuidance guider): our schedule
+ transitions reproduce the stock HunyuanVideo15Pipeline (with its guider's rescale too), a rollout stores video
latents [T, B, C, F, h, w] and trains with LoRA, the warm-up loss runs on video latents, the precache form round-trips,
and the exports load in diffusers and peft."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

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
PROMPTS = ["a red cube", 'a sign that says "hello"']  # the second quotes a text: ByT5 glyph tokens
# the dual-stream blocks' image and text projections and MLPs (the token refiner's to_q/... match too), the output
TARGETS = [
    "to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff.net.0.proj",
    "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "proj_out",
]  # fmt: skip


def train_config(guidance: float = 6.0, frames: int | None = 9):
    return recipe_from_tree({"train": {
        "data": {"source": "smoke", "prompts_per_rollout": 2},
        "sampling": {"samples_per_prompt": 2, "num_inference_steps": 3, "guidance_scale": guidance, "height": 32,
                     "width": 32, "num_frames": frames, "fps": 8},
        "model": {"family": "hunyuan_video15", "path": "tiny:hunyuan_video15",
                  "lora": {"rank": 4, "alpha": 8, "target_modules": TARGETS}},
        "algorithm": {"eta": 0.7, "micro_batch_size": 2, "learning_rate": 0.05},
        "steps": 2,
    }}).train  # fmt: skip


def load(lora: bool = False, guidance: float = 6.0):
    config = train_config(guidance)
    if not lora:
        config.model.lora = None
    return build_family(config.model, config.sampling), config


@pytest.mark.parametrize(("guidance", "rescale"), [(4.0, 0.7)])  # CFG 6 without rescale: 1.2e-6, measured once
def test_eta_zero_reproduces_the_stock_pipeline_latents_and_frames(guidance, rescale):
    from diffusers.guiders import ClassifierFreeGuidance

    family, config = load(guidance=guidance)
    family.pipeline.guider = ClassifierFreeGuidance(guidance_scale=guidance, guidance_rescale=rescale)
    shape = family.sample_shape(config.sampling)
    assert shape == (4, 3, 2, 2)  # 9 frames -> 1 + 8 / 4 latent frames; 32 px / VAE 16
    x = family.initial_noise(["s0", "s1"], 0, shape)
    cond = family.encode(PROMPTS)
    schedule, ours = family.schedule(3, shape), x
    with torch.no_grad():
        for index in range(3):
            ours = family.transition(ours, index, 0.0, cond, schedule).sample
    # (the stock pipeline needs one negative prompt per prompt: a lone "" fails its reshape for 2 prompts)
    stock = dict(height=32, width=32, num_frames=9, num_inference_steps=3)
    latents = family.pipeline(prompt=PROMPTS, negative_prompt=["", ""], **stock, latents=x, output_type="latent")
    assert schedule == family.pipeline.scheduler.sigmas.tolist()
    torch.testing.assert_close(latents.frames, ours, atol=1e-5, rtol=0)
    videos = family.decode(ours)
    assert [type(v) for v in videos] == [Video, Video] and len(videos[0]) == 9 and videos[0].size == (32, 32)
    assert videos[0].fps == 8  # sampling.fps
    for i, video in enumerate(videos):  # the stock VAE decodes one video at a time (see `decode`)
        frames = family.pipeline(
            prompt=PROMPTS[i : i + 1], negative_prompt=[""], **stock, latents=x[i : i + 1], output_type="np"
        ).frames
        ours_np = np.stack([np.asarray(f, dtype=np.float64) / 255 for f in video.frames])
        assert np.abs(ours_np - frames[0]).max() <= 1 / 255 + 1e-6  # the same frames, up to 8-bit rounding


def test_rollout_trains_on_video_latents_and_the_warmup_loss_runs():
    config = train_config()
    family = build_family(config.model, config.sampling)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(family, samples, config.sampling, config.algorithm, seed=0)
    assert rollout.latents_TB.shape == (3, 4, 4, 3, 2, 2) and torch.isfinite(rollout.logp_TB).all()
    assert all(isinstance(v, Video) and len(v) == 9 for v in rollout.outputs)
    before = [p.detach().clone() for p in family.parameters()]
    metrics = TrainStack(family, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, family.parameters(), strict=True))

    latents = family.encode_pixels(torch.rand(2, 3, 9, 32, 32) * 2 - 1)
    assert latents.shape == (2, 4, 3, 2, 2)
    text = family.encode_texts(["a red square", 'stripes and "STOP"'])
    generators = [torch.Generator().manual_seed(s) for s in range(2)]
    warm = WarmupStack(family, WarmupConfig(learning_rate=1e-2), 1.0).train(latents, text, generators, step=0)
    assert math.isfinite(warm["loss"]) and warm["grad_norm"] > 0


def test_the_precache_form_round_trips_and_frames_are_checked():
    family, _ = load()
    cond = family.encode_texts(PROMPTS)
    assert cond["glyph_mask"][0].sum() == 0 and cond["glyph_mask"][1].sum() > 0  # only the quoting prompt has glyphs
    unpacked = family.unpack_conditioning(family.pack_conditioning(cond), family.path)
    assert all(torch.equal(unpacked[k].to(v.dtype), v) for k, v in cond.items())
    message = ("train.sampling.num_frames: 32, but (num_frames - 1) % 4 = 3: the hunyuan_video15 VAE keeps the first "
               "frame and compresses each 4 after it into one latent frame; use 29 or 33")  # fmt: skip
    assert message in DiffusionDomain.start_problems(train_config(frames=32))


def velocity_of(transformer, cond: dict) -> torch.Tensor:
    """The denoiser's output on a fixed video latent, called as the stock pipeline calls it (all padded text
    tokens, 729 zero image tokens): what an exported model must reproduce."""
    x = torch.randn((1, 9, 3, 2, 2), generator=torch.Generator().manual_seed(3))
    return transformer(
        hidden_states=x, timestep=torch.tensor([600.0]), encoder_hidden_states=cond["embeds"][:1],
        encoder_attention_mask=cond["mask"][:1].float(), encoder_hidden_states_2=cond["glyph_embeds"][1:],
        encoder_attention_mask_2=cond["glyph_mask"][1:].float(),
        image_embeds=torch.zeros(1, 729, transformer.config.image_embed_dim), return_dict=False,
    )[0]  # fmt: skip


def test_exports_load_in_diffusers_and_peft(tmp_path):
    from diffusers import DiffusionPipeline, HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel
    from peft import PeftModel

    family, config = load(lora=True)
    for parameter in family.parameters():  # a trained adapter: gaussian init leaves B at zero
        parameter.data.add_(torch.randn_like(parameter) * 0.1)
    cond = family.encode_texts(PROMPTS)
    folder = resolve_model_path(config.model.path)
    (tmp_path / "adapter").mkdir()
    with torch.no_grad():
        trained = velocity_of(family.trainable, cond)
        family.export_adapter(tmp_path / "adapter", folder)
        base = HunyuanVideo15Transformer3DModel.from_pretrained(folder, subfolder="transformer")
        assert not torch.allclose(velocity_of(base, cond), trained, atol=1e-4)
        peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
        torch.testing.assert_close(velocity_of(peft_model, cond), trained, atol=1e-5, rtol=1e-4)
        pipeline = HunyuanVideo15Pipeline.from_pretrained(folder)
        assert not hasattr(pipeline, "load_lora_weights")  # no LoRA loader mixin: the transformer loads the file
        pipeline.transformer.load_lora_adapter(
            str(tmp_path / "adapter"), weight_name="pytorch_lora_weights.safetensors", prefix="transformer"
        )
        torch.testing.assert_close(velocity_of(pipeline.transformer, cond), trained, atol=1e-5, rtol=1e-4)
        family.export_merged(tmp_path / "merged", folder)
        merged = DiffusionPipeline.from_pretrained(str(tmp_path / "merged"))
        assert type(merged) is HunyuanVideo15Pipeline
        torch.testing.assert_close(velocity_of(merged.transformer, cond), trained, atol=1e-5, rtol=1e-4)
