"""`unirl plan`: real model sizes from configs on the meta device (no weights), and the memory terms' arithmetic."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.config import load_recipe
from unirl_core.controller.memory import GIB, memory_plan
from unirl_core.models.real_sizes import VARIANTS, meta_pipeline, parameter_count

# published sizes in billions (model cards: SD3.5 Large 8.1 B, Medium 2.5 B, FLUX.1 12 B, Qwen-Image 20 B,
# FLUX.2-Klein 9B; SDXL's UNet 2.6 B, T5-XXL's encoder 4.76 B, OpenCLIP bigG text 695 M, CLIP-L text 124 M, SD 1.5's
# UNet 860 M, Qwen2.5-VL-7B 8.3 B, Qwen3-8B 8.2 B), within 3%; counted as parameters + buffers (SD3's fixed position
# embedding is a buffer: 192^2 x 2432 = 90 M in Large, 384^2 x 1536 = 226 M in Medium)
PUBLISHED = {
    "sd3.5-medium": {"transformer": 2.5, "text_encoder": 0.124, "text_encoder_2": 0.695, "text_encoder_3": 4.76},
    "sd3.5-large": {"transformer": 8.1},
    "sd1.5": {"unet": 0.86, "text_encoder": 0.123, "vae": 0.0838},
    "sdxl-base-1.0": {"unet": 2.6, "text_encoder_2": 0.695},
    "flux1-dev": {"transformer": 12.0, "text_encoder_2": 4.76},
    "qwen-image": {"transformer": 20.0, "text_encoder": 8.3},
    "flux2-klein-9b": {"transformer": 9.0, "text_encoder": 8.2},
    "wan2.1-t2v-1.3b": {"transformer": 1.42, "text_encoder": 5.68},  # fp32 5.68 GB; umT5-XXL's encoder
    "wan2.2-t2v-a14b": {"transformer": 14.3, "transformer_2": 14.3},
    "hunyuanvideo-1.5-480p-t2v": {"transformer": 8.3, "text_encoder": 7.07},  # Qwen2.5-VL-7B's language model
}
RECIPES = {  # packaged recipe -> the real variant it is written for
    "flux_dev_grpo": "flux1-dev", "flux_kontext_grpo": "flux1-kontext-dev", "flux2_klein_grpo": "flux2-klein-base-9b",
    "qwen_image_grpo": "qwen-image", "qwen_image_edit_grpo": "qwen-image-edit", "sdxl_ddpo": "sdxl-base-1.0",
    "sd35_medium_grpo": "sd3.5-medium", "sd35_large_grpo": "sd3.5-large", "wan2_1_t2v_ocr_grpo": "wan2.1-t2v-1.3b",
    "wan2_1_i2v_grpo": "wan2.1-i2v-14b-480p", "wan2_2_t2v_a14b_grpo": "wan2.2-t2v-a14b",
    "wan2_2_ti2v_5b_grpo": "wan2.2-ti2v-5b", "hunyuan_video15_grpo": "hunyuanvideo-1.5-480p-t2v",
    **{f"sd35_medium_{name}": "sd3.5-medium"
       for name in ("flow_grpo_fast", "mixgrpo", "mixgrpo_flash", "dancegrpo", "grpo_guard", "flow_dppo",
                    "diffusion_nft")},
}  # fmt: skip


@pytest.mark.parametrize("variant", sorted(PUBLISHED))
def test_variants_have_their_published_sizes(variant):
    components = meta_pipeline(variant)
    assert all(p.device.type == "meta" for m in components.values() for p in m.parameters())  # nothing allocated
    for name, billions in PUBLISHED[variant].items():
        assert parameter_count(components[name]) / 1e9 == pytest.approx(billions, rel=0.03), name


def test_every_variant_builds_and_names_a_known_family():
    from unirl_core.models.registry import family_class

    for name, variant in VARIANTS.items():
        family = family_class(variant["family"])
        assert family.denoiser_name in meta_pipeline(name), name


def sd35(**overrides):
    sets = {"train.sampling.height": 512, "train.sampling.width": 512, "train.ray.workers": 8,
            "train.data.prompts_per_rollout": 16, "train.sampling.samples_per_prompt": 16,
            "train.model.dtype": "bfloat16", "train.model.lora.rank": 32, "train.algorithm.micro_batch_size": 8,
            **overrides}  # fmt: skip
    return load_recipe("demo", [f"{k}={v}" for k, v in sets.items()]).train


def test_terms_follow_the_documented_arithmetic():
    plan = memory_plan(sd35(), "sd3.5-medium")
    params = plan.parameters
    assert plan.samples_per_worker == 32 and plan.tokens == 32 * 32 + 333  # 512 px / stride 16, CLIP 77 + T5 256
    text = params["text_encoder"] + params["text_encoder_2"] + params["text_encoder_3"]
    assert plan.training["text encoders"] == pytest.approx(text * 2 / GIB)  # bf16, on every worker
    assert plan.training["trainable: weights, gradients, Adam"] == pytest.approx(16 * plan.trainable / 8 / GIB)
    # activations: micro-batch 8, no CFG (demo guidance 1.0), 1357 tokens, width 24 x 64, 24 blocks, 34 bytes/2 x 2
    assert plan.training["activations"] == pytest.approx(8 * 1357 * 1536 * 34 * 24 / GIB)
    checkpointed = memory_plan(sd35(**{"train.fsdp.activation_checkpointing": "true"}), "sd3.5-medium")
    assert checkpointed.training["activations (checkpointed)"] < plan.training["activations"] / 5
    with_cfg = memory_plan(sd35(**{"train.sampling.guidance_scale": 4.5}), "sd3.5-medium")
    assert with_cfg.training["activations"] == pytest.approx(2 * plan.training["activations"])
    assert plan.largest()[0] == "training: activations"
    more_workers = memory_plan(sd35(**{"train.ray.workers": 16}), "sd3.5-medium")
    assert more_workers.training["denoiser weights (shard + one block)"] < plan.training[
        "denoiser weights (shard + one block)"]  # fmt: skip


def test_cached_prompts_take_the_text_encoders_off_the_gpus_and_decode_batches_bound_the_vae():
    plan = memory_plan(sd35(), "sd3.5-medium")
    cached = memory_plan(sd35(**{"train.model.text_embedding_cache": "/cache"}), "sd3.5-medium")
    assert cached.training["text encoders (on the CPU)"] == 0 and plan.training["text encoders"] > 10
    kept = memory_plan(sd35(**{"train.model.text_embedding_cache": "/cache", "train.model.text_encoders": "device"}),
                       "sd3.5-medium")  # fmt: skip
    assert kept.training["text encoders"] == plan.training["text encoders"]
    one = memory_plan(sd35(**{"train.model.vae_decode_batch": 1}), "sd3.5-medium")
    assert one.rollout["VAE decode (chunks of 1)"] == pytest.approx(plan.rollout["VAE decode (chunks of 8)"] / 8)
    big = {"train.sampling.height": 1024, "train.sampling.width": 1024}
    tiled = memory_plan(sd35(**big, **{"train.model.vae_tiling": "true"}), "sd3.5-medium")
    assert tiled.rollout["VAE decode (chunks of 8, tiled)"] == pytest.approx(plan.rollout["VAE decode (chunks of 8)"])


def test_unirl_plan_prints_the_plan_and_refuses_a_mismatched_variant(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["plan", "demo", "--variant", "sd3.5-large"])
    assert result.exit_code == 0, result.output
    assert "transformer" in result.stdout and "8.146 B parameters" in result.stdout
    assert "largest term:" in result.stdout and "GiB" in result.stdout
    result = runner.invoke(app, ["plan", "demo", "--variant", "sd1.5"])
    assert result.exit_code == 2 and "sd1.5 is a sd15 model but train.model.family is sd3" in result.stderr
    result = runner.invoke(app, ["plan", "demo", "--set", f"train.model.path={tmp_path}"])
    assert result.exit_code == 2 and "pass --variant, one of: sd3.5-large, sd3.5-medium" in result.stderr


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_packaged_family_recipes_plan_at_their_real_size_before_any_location_is_set(recipe, monkeypatch):
    """The plan reads no data, reward or weights: the recipe's unset locations (MODEL_PATH, DATA_PATH, CLIP_PATH)
    are named, not refused; without --variant, an unset MODEL_PATH is the one thing asked for."""
    for name in ("MODEL_PATH", "DATA_PATH", "CLIP_PATH"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["plan", recipe, "--variant", RECIPES[recipe]])
    assert result.exit_code == 0, result.output
    training = float(result.stdout.split("training: ")[1].split(" GiB")[0])
    assert 1 < training < 80, result.stdout  # each recipe's batch is sized to fit an 80 GB GPU
    assert "not set, and not needed for the plan: " in result.stdout and "MODEL_PATH" in result.stdout
    result = CliRunner().invoke(app, ["plan", recipe])
    assert result.exit_code == 2 and result.stderr.startswith("error: train.model.path comes from MODEL_PATH, which is")
    assert f"pass --variant, one of: {RECIPES[recipe]}" in result.stderr or RECIPES[recipe] in result.stderr


def test_a_causal_lm_recipe_plans_from_its_config_with_the_documented_terms():
    """`unirl plan qwen3_8b_grpo --variant qwen3-8b`: Qwen3-8B's 8.2 B parameters; LoRA r64 on the 7 linear layers of
    each of 36 layers is 64 x (in + out) summed: 36 x 64 x 75,776 = 174.6 M; the KV cache is N S L 2 kv_heads
    head_dim b (docs of unirl_core/domains/ar/plan.py)."""
    from unirl_core.domains.ar.plan import PROMPT_TOKENS, lm_memory_plan

    config = load_recipe("qwen3_8b_grpo", ["train.model.path=unused", "train.data.data_path=unused"]).train
    plan = lm_memory_plan(config, "qwen3-8b")
    assert plan.parameters["model"] / 1e9 == pytest.approx(8.2, rel=0.03)
    assert plan.trainable == 36 * 64 * (2 * 4096 + 2 * (4096 + 1024) + 4096 + 4096 + 3 * (4096 + 12288))
    samples, tokens = 32 * 8 // 8, PROMPT_TOKENS + 1024
    assert plan.samples_per_worker == samples and plan.tokens == tokens
    assert plan.rollout["KV cache"] * 1024**3 == pytest.approx(samples * tokens * 36 * 2 * 8 * 128 * 2)
    assert plan.training["logits and log-probs"] * 1024**3 == pytest.approx(4 * tokens * 151936 * (2 + 8))
    assert plan.largest()[0] == "training: activations"
    checkpointed = lm_memory_plan(config.model_copy(update={"fsdp": config.fsdp.model_copy(
        update={"activation_checkpointing": True})}), "qwen3-8b")  # fmt: skip
    assert checkpointed.training_total < plan.training_total / 2


def test_a_vlm_recipe_plans_its_vision_tower_and_image_tokens():
    """`unirl plan qwen2_5_vl_7b_grpo --variant qwen2.5-vl-7b`: Qwen2.5-VL-7B's 8.29 B parameters (the 7.6 B language
    model and its 0.67 B vision tower); LoRA r64 on the 4 attention projections of 28 layers; a 448 px image is
    (448 / (14 x 2))^2 = 256 tokens of each sample's prompt."""
    from unirl_core.domains.ar.plan import PROMPT_TOKENS, lm_memory_plan

    config = load_recipe("qwen2_5_vl_7b_grpo", ["train.model.path=unused", "train.data.data_path=unused"]).train
    plan = lm_memory_plan(config, "qwen2.5-vl-7b")
    assert plan.family == "vlm" and plan.parameters["model"] / 1e9 == pytest.approx(8.29, rel=0.005)
    assert plan.trainable == 28 * 64 * (2 * 3584 + 2 * (3584 + 512) + 2 * 3584)
    assert plan.tokens == PROMPT_TOKENS + 256 + 1024
    assert plan.rollout["KV cache"] * 1024**3 == pytest.approx(16 * plan.tokens * 28 * 2 * 4 * 128 * 2)


def test_unirl_plan_of_a_causal_lm_recipe_needs_no_data_or_weights(monkeypatch):
    from typer.testing import CliRunner

    for name in ("DATA_PATH", "MODEL_PATH"):  # `unirl demo` run in this process before sets DATA_PATH for its flow
        monkeypatch.delenv(name, raising=False)

    from flows.cli import app

    result = CliRunner().invoke(app, ["plan", "qwen3_8b_grpo", "--variant", "qwen3-8b"])
    assert result.exit_code == 0, result.output
    assert "model: causal_lm from qwen3-8b" in result.stdout and "largest term: training: activations" in result.stdout
    assert "not set, and not needed for the plan: DATA_PATH, MODEL_PATH" in result.stdout
    refused = CliRunner().invoke(app, ["plan", "qwen3_8b_grpo", "--variant", "sd3.5-medium"])
    assert (
        refused.exit_code == 2
        and "is not a causal LM or VLM; variants: qwen3-8b, qwen3-4b, qwen2.5-vl-7b" in refused.output
    )
