"""Where a tensor meets the model on a rank: the loss inputs on one device, and the process-group backend chosen
from the worker's own device (a CPU worker on a GPU node gets gloo)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from unirl_core.algorithms.registry import algorithm_config
from unirl_core.distributed import process_group
from unirl_core.distributed.rank import TorchWorker
from unirl_core.domains.diffusion.stack import TrainStack
from unirl_core.worker.fsdp import mixed_precision_policy
from unirl_core.worker.worker import TrainWorker

# --- the backend follows the worker's device --------------------------------------------------------------------


def test_the_backend_is_a_function_of_the_workers_device():
    default_backend, resolve_backend = process_group.default_backend, process_group.resolve_backend
    assert default_backend(torch.device("cpu")) == "gloo" and default_backend("cpu") == "gloo"
    assert default_backend(torch.device("cuda", 0)) == "nccl" and default_backend("cuda:3") == "nccl"
    assert resolve_backend(None, "cpu") == resolve_backend("auto", "cpu") == "gloo"
    assert resolve_backend("auto", "cuda:0") == "nccl"
    assert resolve_backend("nccl", "cpu") == "nccl" and resolve_backend("gloo", "cuda:0") == "gloo"  # explicit wins


@pytest.fixture
def gpu_node(monkeypatch):
    """This process on a node with GPUs (every GPU visible, as Ray 2.60 leaves them to a zero-GPU actor), and
    `init_process_group` recording the backend it is asked for."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    asked = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kwargs: asked.append(backend))
    return asked


@pytest.mark.parametrize(
    ("gpus", "setting", "backend"),
    [(0, None, "gloo"), (1, None, "nccl"), (0, "nccl", "nccl"), (1, "gloo", "gloo")],
)
def test_a_worker_picks_its_backend_from_its_own_gpus_not_the_nodes(gpu_node, gpus, setting, backend):
    worker = TorchWorker()
    worker.gpus, worker.store = gpus, object()  # rank 0's store: no rendezvous in this test
    assert worker.setup(0, 1, "127.0.0.1", 0, setting) == backend
    assert gpu_node == [backend]


def test_an_explicit_nccl_backend_on_a_cpu_worker_is_refused_naming_the_key(monkeypatch):
    from unirl_core.config.schema import TrainConfig
    from unirl_core.errors import UserError

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    with pytest.raises(UserError, match=r"train\.ray\.backend: nccl cannot reduce this worker's CPU tensors"):
        TrainWorker().build(TrainConfig().model_dump_json(), "rl")


# --- every loss input on the log-probs' device --------------------------------------------------------------------


class MetaAdapter:
    """A model whose outputs live on another device than the CPU (the meta device stands in for CUDA)."""

    def __init__(self):
        self.weight = torch.nn.Parameter(torch.ones(1))
        self.trainable = torch.nn.Linear(1, 1)  # the module FSDP2 would shard (here: not sharded)

    def parameters(self):
        return [self.weight]

    def select(self, cond, index):
        return cond

    def step_sampling(self, algorithm):
        return None

    def transition(self, x, index, eta, cond, schedule, prev_sample=None, sampling=None):
        return SimpleNamespace(log_prob=torch.zeros(len(x), device="meta"))


def test_the_train_stack_brings_cpu_advantages_to_the_log_probs_device(monkeypatch):
    adapter, seen = MetaAdapter(), []

    def checked_loss(algorithm, result, logp_old, mean_old, advantages):  # GRPO.policy_loss, `algorithm` its self
        seen.append({t.device.type for t in (result.log_prob, logp_old, advantages)})
        one = torch.ones(())
        terms = (adapter.weight * 0).expand(len(advantages))
        return terms, {"ratio_mean": one, "ratio_min": one, "ratio_max": one}

    stack = TrainStack(adapter, algorithm_config({"micro_batch_size": 2}))
    monkeypatch.setattr("unirl_core.algorithms.grpo.GRPO.policy_loss", checked_loss)
    rollout = SimpleNamespace(
        latents_TB=torch.zeros(2, 4, 1), next_latents_TB=torch.zeros(2, 4, 1), steps=[0, 1], schedule=None,
        cond={}, logp_TB=torch.zeros(2, 4, device="meta"), samples=None,
        trained=lambda: torch.arange(2).expand(4, -1),
    )  # fmt: skip
    stack.train(rollout, torch.tensor([1.0, -1.0, 1.0, -1.0]), step=0)  # advantages on the CPU, as a worker has them
    assert seen and all(devices == {"meta"} for devices in seen)


def test_the_worker_builds_the_advantages_on_its_device():
    worker, received = TrainWorker(), []
    worker.device, worker.ema, worker._rollout = torch.device("meta"), None, object()
    worker.stack = SimpleNamespace(train=lambda rollout, advantages, step: received.append(advantages) or {})
    worker.train([0.5, -0.5], step=0)
    assert received[0].device.type == "meta" and received[0].dtype == torch.float32


# --- mixed precision: the policy -----------------------------------------------------------------------------------


def test_a_bf16_model_computes_in_bf16_on_any_device_and_a_float32_model_on_cpu_stays_float32():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert mixed_precision_policy("auto", cpu, torch.float32).param_dtype is None  # the CPU demo: untouched
    for device in (cpu, cuda):
        policy = mixed_precision_policy("auto", device, torch.bfloat16)
        assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy("auto", cuda, torch.float32).param_dtype == torch.bfloat16
    assert mixed_precision_policy("none", cuda, torch.float32).param_dtype is None
