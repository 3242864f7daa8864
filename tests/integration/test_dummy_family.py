"""Adding a family is one file: `tests/support/dummy_family.py` (a `Family` subclass written from the contract, not
from SD3Family) goes through the registry, a rollout, an RL step, a warm-up step and both exports unchanged, and its
numbers are its own, not SD3's."""

from __future__ import annotations

import image_cases as cases
import pytest
import torch
from dummy_family import DummyFamily

from unirl_core.config import load_recipe
from unirl_core.config.schema import WarmupConfig
from unirl_core.data.grpo_groups import expand_groups
from unirl_core.data.sources import build_source
from unirl_core.domains.diffusion.rollout.rollout import run_rollout
from unirl_core.domains.diffusion.stack import TrainStack, WarmupStack
from unirl_core.models.registry import (
    UnknownFamilyError,
    build_family,
    family_class,
    family_names,
    register,
    resolve_model_path,
)

SMALL = [
    "train.model.family=dummy_flow",
    "train.model.path=tiny:dummy_flow",
    "train.data.prompts_per_rollout=2",
    "train.sampling.samples_per_prompt=2",
    "train.sampling.num_inference_steps=3",
    "train.algorithm.micro_batch_size=2",
]


@pytest.fixture(scope="module")
def config():
    """The dummy family registered for this module only (the registry is process-wide)."""
    from unirl_core.models import registry

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))
        register(DummyFamily)
        yield load_recipe("demo", SMALL).train


def snapshot(adapter) -> list[torch.Tensor]:
    return [p.detach().clone() for p in adapter.parameters()]


def changed(before: list[torch.Tensor], adapter) -> bool:
    return any(not torch.equal(a, p) for a, p in zip(before, adapter.parameters(), strict=True))


def velocity(transformer, cond: dict) -> torch.Tensor:
    """The denoiser's output on a fixed input: what an exported model must reproduce."""
    x = torch.randn((1, 4, 16, 16), generator=torch.Generator().manual_seed(3))
    return transformer(
        hidden_states=x, timestep=torch.tensor([500.0]), encoder_hidden_states=cond["text_tokens"],
        pooled_projections=cond["text_pooled"], return_dict=False,
    )[0]  # fmt: skip


def test_module_class_names_load_without_registering_and_unknown_names_list_the_built_ins():
    names = family_names()
    assert family_class("dummy_family:DummyFamily") is DummyFamily  # tests/support is on pytest's pythonpath
    # the repo-relative dotted path loads the same file as a second module (a distinct but equal class)
    by_package = family_class("tests.support.dummy_family:DummyFamily")
    assert by_package.__module__ == "tests.support.dummy_family" and by_package.name == "dummy_flow"
    assert family_names() == names  # importing by module:Class registers nothing
    with pytest.raises(UnknownFamilyError, match=r"'no_such_family' is unknown: choose one of .*sd15, sd3"):
        family_class("no_such_family")
    with pytest.raises(UnknownFamilyError, match="is not a subclass of unirl_core.models.family.Family"):
        family_class("image_cases:RED")


def test_the_family_makes_its_own_choices(config):
    adapter = build_family(config.model, config.sampling)
    assert type(adapter) is DummyFamily
    folder = resolve_model_path("tiny:dummy_flow")
    sd3 = build_family(config.model.model_copy(update={"family": "sd3", "path": folder}), config.sampling)
    assert adapter.schedule(4, (4, 16, 16)) == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert sd3.schedule(4, (4, 16, 16)) != adapter.schedule(
        4, (4, 16, 16)
    )  # same folder, same scheduler config: SD3 shifts its sigmas

    cond = adapter.encode_texts(["a red cube", "a blue ball"])
    assert set(cond) == {"text_tokens", "text_pooled"}
    torch.testing.assert_close(cond["text_pooled"], sd3.encode_texts(["a red cube", "a blue ball"])["pooled"])
    unpacked = DummyFamily.unpack_conditioning(adapter.pack_conditioning(cond), folder)
    assert all(torch.equal(unpacked[k], cond[k]) for k in cond)
    assert adapter.text_identity()["family"] == "dummy_flow"

    clean, noise = torch.zeros(1, 4, 16, 16), torch.ones(1, 4, 16, 16)
    assert torch.equal(
        adapter.noised(clean, noise, 2, adapter.schedule(4, (4, 16, 16))), torch.full((1, 4, 16, 16), 0.5)
    )
    latents = adapter.encode_images([cases.procedural(32, 32, seed=s) for s in range(2)])
    sd3_cond = sd3.encode_texts(["a red cube", "a blue ball"])
    ours = adapter.denoising_loss(latents, cond, torch.Generator().manual_seed(1))
    theirs = sd3.denoising_loss(latents, sd3_cond, torch.Generator().manual_seed(1))
    assert torch.isfinite(ours) and ours != theirs  # same weights, same draws: a different sigma rule

    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    mine = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    other = run_rollout(sd3, samples, config.sampling, config.algorithm, seed=0)
    assert torch.equal(mine.latents_TB[0], other.latents_TB[0])  # the same initial noise ...
    assert not torch.allclose(mine.next_latents_TB[-1], other.next_latents_TB[-1])  # ... denoised differently


def test_rollout_rl_step_warmup_step_and_exports(config, tmp_path):
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from peft import PeftModel

    adapter = build_family(config.model, config.sampling)
    samples = expand_groups(build_source(config.data).next_batch(), config.sampling.samples_per_prompt)
    rollout = run_rollout(adapter, samples, config.sampling, config.algorithm, seed=0)
    assert rollout.latents_TB.shape == (3, 4, 4, 16, 16) and len(rollout.images) == 4
    assert torch.isfinite(rollout.logp_TB).all() and rollout.schedule == adapter.schedule(3, (4, 16, 16))

    before = snapshot(adapter)
    metrics = TrainStack(adapter, config.algorithm).train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)
    assert metrics["ratio_mean"] == 1.0 and metrics["grad_norm"] > 0 and changed(before, adapter)

    before = snapshot(adapter)
    latents = adapter.encode_images([cases.procedural(32, 32, seed=s) for s in range(2)])
    cond = adapter.encode_texts(["a red square", "stripes"])
    stack = WarmupStack(adapter, WarmupConfig(learning_rate=1e-2), config.algorithm.max_grad_norm)
    warm = stack.train(latents, cond, [torch.Generator().manual_seed(s) for s in range(2)], step=0)
    assert torch.isfinite(torch.tensor(warm["loss"])) and warm["grad_norm"] > 0 and changed(before, adapter)

    folder = resolve_model_path(config.model.path)
    (tmp_path / "adapter").mkdir()  # the caller makes the folder (as `export_checkpoint` does)
    with torch.no_grad():
        trained = velocity(adapter.trainable, cond)
        adapter.export_adapter(tmp_path / "adapter", folder)
        base = SD3Transformer2DModel.from_pretrained(folder, subfolder="transformer")
        assert not torch.allclose(velocity(base, cond), trained)  # the training moved the output
        peft_model = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
        torch.testing.assert_close(velocity(peft_model, cond), trained, atol=1e-5, rtol=1e-4)
        adapter.export_merged(tmp_path / "merged", folder)
        pipeline = StableDiffusion3Pipeline.from_pretrained(str(tmp_path / "merged"))
        torch.testing.assert_close(velocity(pipeline.transformer, cond), trained, atol=1e-5, rtol=1e-4)


def test_the_whole_training_runs_the_family_through_the_one_controller(config, tmp_path):
    """The controller, the worker (FSDP2), checkpoints, metrics and the export with nothing but the family's file:
    `train_in_process` on one rank in this process, where `register` is visible."""
    from unirl_core.controller import train_in_process

    one_rank = config.model_copy(update={
        "output_dir": str(tmp_path), "steps": 2, "eval_every_rounds": 0,
        "ray": config.ray.model_copy(update={"workers": 1}),
    })  # fmt: skip
    rows: list[dict] = []
    summary = train_in_process(one_rank, "dummy-family", on_step=rows.append)
    assert [row["step"] for row in rows] == [0, 1] and rows[0]["ratio_mean"] == 1.0
    assert all(row["grad_norm"] > 0 for row in rows)
    assert summary.rounds[0].checkpoint.endswith("step_00000001")
    assert (tmp_path / "export" / "step_00000001" / "adapter_model.safetensors").is_file()
    assert summary.model_version is not None  # registered in MLflow
