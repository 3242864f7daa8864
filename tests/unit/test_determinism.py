"""`train.deterministic`: the key validates and, at rank setup, sets cuBLAS's workspace and torch's flags."""

from __future__ import annotations

import os

import pytest
import torch

from unirl_core.config import load_recipe
from unirl_core.errors import UserError
from unirl_core.worker.determinism import apply_determinism


@pytest.fixture
def restore_flags(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             torch.backends.cudnn.deterministic)  # fmt: skip
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[1], saved[2]


def test_determinism_sets_cublas_workspace_and_torch_flags(restore_flags):
    torch.backends.cudnn.benchmark = True
    apply_determinism(False)  # off: nothing changes
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ and torch.backends.cudnn.benchmark
    apply_determinism(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic


def test_deterministic_key_validates():
    assert load_recipe("demo").train.deterministic is False
    assert load_recipe("demo", ["train.deterministic=true"]).train.deterministic is True
    with pytest.raises((UserError, ValueError)):
        load_recipe("demo", ["train.deterministic=sometimes"])


def test_rank_setup_applies_the_recipe_key(restore_flags, monkeypatch):
    import unirl_core.models.registry
    from unirl_core.worker.worker import TrainWorker

    class ModelBuildReached(Exception):
        pass

    def stop(*args, **kwargs):  # the flags must already be set when the model is built (its first cuBLAS call)
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        raise ModelBuildReached

    monkeypatch.setattr(unirl_core.models.registry, "build_family", stop)
    config = load_recipe("demo", ["train.deterministic=true"]).train
    with pytest.raises(ModelBuildReached):
        TrainWorker.__new__(TrainWorker).build(config.model_dump_json(), "rl")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_deterministic_matmul_repeats_bitwise_on_gpu(restore_flags):
    apply_determinism(True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(512, 4096, device="cuda", generator=generator, requires_grad=True)
    b = torch.randn(4096, 512, device="cuda", generator=generator)
    grads = []
    for _ in range(2):
        a.grad = None
        (a @ b).square().sum().backward()
        grads.append(a.grad.clone())
    assert torch.equal(grads[0], grads[1])
