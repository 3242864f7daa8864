"""Text encoders off the training GPUs (`train.model.text_encoders`) and the cheap, content-exact text-encoder
fingerprint (`text_identity` hashes the weight files once per machine)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import unirl_core.models.text_cache as text_cache
from unirl_core.config.schema import ModelConfig, SamplingConfig
from unirl_core.models.parts.text import text_encoder_placement
from unirl_core.models.registry import build_family, family_class, write_tiny_model
from unirl_core.workspace import workspace

PROMPTS = ["a red cube", "a blue ball"]


@pytest.fixture(scope="module")
def sd3_folder(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "sd3", "sd3", seed=0))


@pytest.mark.parametrize(
    ("setting", "device", "cache", "text_only", "expected"),
    [
        ("auto", "cuda:0", True, True, "cpu"),  # the cache serves the prompts: the encoders leave the GPU
        ("auto", "cuda:3", False, True, "device"),  # no cache: every rollout encodes, on the GPU
        ("auto", "cpu", True, True, "device"),  # already on the CPU
        ("auto", "cuda:0", True, False, "device"),  # an edit model's VLM reads every condition image
        ("cpu", "cuda:0", False, True, "cpu"),
        ("cpu", "cuda:0", True, False, "cpu"),
        ("device", "cuda:0", True, True, "device"),
        ("device", "cpu", False, True, "device"),
    ],
)
def test_placement_rule(setting, device, cache, text_only, expected):
    assert text_encoder_placement(setting, device, cache, text_only) == expected


def test_placement_rule_refuses_an_unknown_setting():
    with pytest.raises(ValueError, match="text_encoders 'gpu'"):
        text_encoder_placement("gpu", "cuda:0", True)


def test_the_recipe_key_defaults_to_auto_and_refuses_other_values():
    assert ModelConfig().text_encoders == "auto"
    with pytest.raises(ValueError):
        ModelConfig(text_encoders="gpu")


def test_text_encoders_on_cpu_encode_the_same_conditioning_bitwise_for_a_model_elsewhere(sd3_folder, tmp_path):
    """The model on the meta device stands in for a GPU: text encoders left there (the old path) could not encode
    at all; with `cpu` placement they stay on the CPU, their tokens go there, and the conditioning is the CPU
    build's, bit for bit, then moved to the model's device."""
    sampling = SamplingConfig()
    reference = build_family(ModelConfig(path=sd3_folder, lora=None), sampling)
    expected = reference.encode_texts([*PROMPTS, sampling.negative_prompt])
    model = ModelConfig(path=sd3_folder, text_encoders="auto", text_embedding_cache=str(tmp_path / "cache"))
    family = build_family(model, sampling, device="meta")
    encoders = family.text_encoder_modules()
    assert set(encoders) == {"text_encoder", "text_encoder_2", "text_encoder_3"}
    assert all(p.device.type == "cpu" for m in encoders.values() for p in m.parameters())
    assert all(p.device.type == "meta" for p in family.trainable.parameters())
    assert all(p.device.type == "meta" for p in family.pipeline.vae.parameters())
    assert family.text_device == torch.device("cpu")
    cond = family.encode(PROMPTS)
    assert {v.device.type for v in cond.values()} == {"meta"}  # the conditioning goes where the model is
    assert family.texts.misses == 3
    table = family.texts([*PROMPTS, sampling.negative_prompt])  # now served by the cache, as stored
    for i, text in enumerate([*PROMPTS, sampling.negative_prompt]):
        for key, value in expected.items():
            assert torch.equal(table[text][key], value[i]), (text, key)


def _count_hashes(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = text_cache.hash_file

    def counting(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(text_cache, "hash_file", counting)
    return calls


def test_text_identity_hashes_the_weight_files_once_per_machine(tmp_path, monkeypatch):
    folder = write_tiny_model(tmp_path / "sd3", "sd3", seed=0)
    calls = _count_hashes(monkeypatch)
    family = family_class("sd3")(str(folder), text_only=True)
    first = family.text_identity()
    assert any(c.endswith("model.safetensors") for c in calls)  # each text encoder's weights, read once
    assert {c.split("/")[-2] for c in calls} == {"text_encoder", "text_encoder_2", "text_encoder_3"}
    memo_path = workspace().root / "cache" / "fingerprints.json"
    memo = json.loads(memo_path.read_text())
    assert all(c in memo for c in calls)
    calls.clear()
    assert family.text_identity() == first
    again = family_class("sd3")(str(folder), text_only=True)  # a new round: a new process builds the model again
    assert again.text_identity() == first
    assert calls == []  # only stat() calls: no weight file read again

    memo_path.write_text("{not json")  # a corrupt memo is ignored and rewritten
    assert again.text_identity() == first
    assert len(calls) > 0 and json.loads(memo_path.read_text()).keys() >= set(calls)


def test_text_identity_changes_when_a_text_encoders_weights_change(tmp_path):
    folder = write_tiny_model(tmp_path / "sd3", "sd3", seed=0)
    before = family_class("sd3")(str(folder), text_only=True).text_identity()
    weights = folder / "text_encoder_2" / "model.safetensors"
    tensors = load_file(weights)
    key = sorted(tensors)[0]
    tensors[key] = tensors[key] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    after = family_class("sd3")(str(folder), text_only=True).text_identity()
    assert after["text_encoders"] != before["text_encoders"]
    assert {k: v for k, v in after.items() if k != "text_encoders"} == {
        k: v for k, v in before.items() if k != "text_encoders"
    }


def test_text_identity_without_files_hashes_the_loaded_weights(sd3_folder):
    family = family_class("sd3")(sd3_folder, text_only=True)
    from_files = family.text_identity()
    family.path = "a/hub/id/not/on/disk"  # no component folders: the in-memory fingerprint
    from_weights = family.text_identity()
    assert from_weights["text_encoders"] != from_files["text_encoders"]
    encoder = family.pipeline.text_encoder
    with torch.no_grad():
        next(encoder.parameters()).add_(1e-3)
    assert family.text_identity()["text_encoders"] != from_weights["text_encoders"]


@pytest.mark.gpu
def test_cpu_placement_keeps_the_text_encoders_out_of_cuda_memory(sd3_folder):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    sampling, allocated = SamplingConfig(), {}
    for placement in ("device", "cpu"):
        torch.cuda.empty_cache()
        start = torch.cuda.memory_allocated()
        family = build_family(ModelConfig(path=sd3_folder, text_encoders=placement), sampling, device="cuda")
        allocated[placement] = torch.cuda.memory_allocated() - start
        size = sum(
            t.numel() * t.element_size()
            for m in family.text_encoder_modules().values()
            for t in [*m.parameters(), *m.buffers()]
        )
        cond = family.encode(PROMPTS)
        assert {v.device.type for v in cond.values()} == {"cuda"}
        if placement == "cpu":
            assert family.text_device.type == "cpu"
            expected = cond
        else:
            reference = cond
        del family
    assert allocated["device"] - allocated["cpu"] >= size, (allocated, size)
    for key, value in reference.items():  # same conditioning, CPU vs GPU numerics
        torch.testing.assert_close(expected[key], value, atol=1e-4, rtol=1e-4)


def test_an_edit_models_vlm_on_cpu_reads_the_condition_images_there(monkeypatch):
    """qwen_image_edit encodes each prompt with its condition image through its VLM text encoder
    (`with_condition_images`): with the VLM on the CPU, the image and tokens go there, the conditioning to the
    model's device (meta here, standing in for a GPU); `auto` keeps an edit model's VLM on the device."""
    from PIL import Image

    sampling = SamplingConfig(guidance_scale=4.0, negative_prompt=" ")
    model = ModelConfig(family="qwen_image_edit", path="tiny:qwen_image_edit", lora=None)
    cpu = build_family(model, sampling)
    images = [Image.new("RGB", (32, 32), colour) for colour in ("red", "navy")]
    prompts = ["make it brighter", "turn the square into a stripe"]
    latents = cpu.encode_images(images)
    expected = cpu.with_condition_images(cpu.encode(prompts), prompts, images, latents)
    family = build_family(model.model_copy(update={"text_encoders": "cpu"}), sampling, device="meta")
    assert family.text_device == torch.device("cpu")
    assert next(family.trainable.parameters()).device.type == "meta"
    encoded = []
    original = family.pipeline.encode_prompt

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        encoded.append(result[0])
        return result

    monkeypatch.setattr(family.pipeline, "encode_prompt", spy)
    cond = family.with_condition_images(family.encode(prompts), prompts, images, latents)
    assert {k: v.device.type for k, v in cond.items()} == {"embeds": "meta", "mask": "meta", "reference": "meta"}
    assert cond["embeds"].shape == expected["embeds"].shape
    for i, embeds in enumerate(encoded):  # [negative x 2, positive x 2], each on the CPU, the CPU build's bitwise
        length = int(expected["mask"][i].sum())
        assert embeds.device.type == "cpu" and torch.equal(embeds[0], expected["embeds"][i, :length])
    assert text_encoder_placement("auto", "cuda:0", True, family.text_only_conditioning) == "device"
