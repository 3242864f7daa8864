"""Issue 15 (cluster-ready): what a round refuses before any Ray work, and the environment its workers get.

No Ray is started here: the machine's GPUs are faked by patching `torch.cuda.device_count`, CPUs by `os.cpu_count`.
"""

from __future__ import annotations

import json
import logging

import pytest

from unirl_core.config import RecipeError, load_recipe
from unirl_core.controller import TrainingConfigError, validate

SECRET = "s3cr3t-value-7f3a"  # must appear nowhere but in the workers' environment


def train_config(tmp_path, *overrides):
    return load_recipe("demo", [f"train.output_dir={tmp_path}", *overrides]).train


@pytest.fixture
def machine(monkeypatch):
    """This machine as the resource checks see it, `machine(cpus=..., gpus=...)`, for a round that starts its own
    local Ray (even when the test session already holds one: `ray_local`)."""
    import os

    import torch

    from unirl_core.distributed import resources

    monkeypatch.setattr(resources, "starts_local_ray", lambda ray_config: not resources.cluster_address(ray_config))

    def set_machine(cpus: int = 2, gpus: int = 0) -> None:
        monkeypatch.setattr(os, "cpu_count", lambda: cpus)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    set_machine()
    return set_machine


def test_fractional_gpus_per_worker_are_refused(tmp_path, machine):
    with pytest.raises(RecipeError, match=r"gpus_per_worker.*a whole number .* ranks share a GPU"):
        train_config(tmp_path, "train.ray.gpus_per_worker=0.5")
    config = train_config(tmp_path)
    config.ray.gpus_per_worker = 0.5  # a config built without load_recipe (a Prefect parameter) is still refused
    machine(gpus=8)
    with pytest.raises(TrainingConfigError, match=r"train.ray.gpus_per_worker: 0.5 must be a whole number"):
        validate(config)


def test_gpus_asked_on_a_machine_without_gpus_are_refused(tmp_path, machine):
    config = train_config(tmp_path, "train.ray.gpus_per_worker=1")
    with pytest.raises(TrainingConfigError, match=r"gpus_per_worker=1 asks for GPUs but this machine has none"):
        validate(config)


def test_too_few_gpus_show_both_numbers(tmp_path, machine):
    machine(cpus=64, gpus=4)
    config = train_config(
        tmp_path, "train.ray.gpus_per_worker=1", "train.ray.workers=8", "train.data.prompts_per_rollout=8"
    )
    with pytest.raises(TrainingConfigError, match=r"8 x 1 = 8 GPUs, but this machine has 4: lower train.ray.workers"):
        validate(config)
    machine(cpus=64, gpus=8)
    validate(config)  # 8 fit


def test_too_few_cpus_show_both_numbers(tmp_path, machine):
    config = train_config(tmp_path, "train.ray.cpus_per_worker=4")
    with pytest.raises(TrainingConfigError, match=r"2 x 4 = 8 CPUs, but this machine has 2"):
        validate(config)


def test_an_existing_cluster_is_asked_when_the_round_connects(tmp_path, machine):
    from unirl_core.distributed.resources import shortfalls

    config = train_config(tmp_path, "train.ray.gpus_per_worker=1", "train.ray.address=ray-head:6379")
    validate(config)  # not this machine's GPUs: the cluster's, asked after connecting
    cluster = {"CPU": 64.0, "GPU": 1.0}
    assert shortfalls(config.ray, cluster, "the Ray cluster at ray-head:6379") == [
        "train.ray.workers x train.ray.gpus_per_worker = 2 x 1 = 2 GPUs, but the Ray cluster at ray-head:6379 has 1: "
        "lower train.ray.workers to 1 or add GPUs"
    ]
    assert shortfalls(config.ray, {"CPU": 64.0, "GPU": 2.0}, "the cluster") == []


def test_the_round_refuses_before_starting_ray(tmp_path, machine):
    """The transport refuses too: `worker_group` with GPUs on a machine without them raises before ray.init."""
    import ray

    from unirl_core.distributed.groups import worker_group
    from unirl_core.distributed.rank import TorchWorker
    from unirl_core.distributed.resources import ClusterResourcesError

    config = train_config(tmp_path, "train.ray.gpus_per_worker=1").ray
    initialized = ray.is_initialized()
    refused = pytest.raises(ClusterResourcesError, match="asks for GPUs but this machine has none")
    with refused, worker_group(TorchWorker, config, tmp_path / "ray.json"):
        pass
    assert ray.is_initialized() == initialized  # no Ray started for it


def test_refusals_and_placement_failures_are_never_retried():
    from prefect.states import Failed

    from tasks.train import is_retryable
    from unirl_core.distributed.resources import ClusterResourcesError
    from unirl_core.distributed.worker_group import PlacementError

    for permanent in (ClusterResourcesError("too small"), PlacementError("not placed")):
        assert not is_retryable(None, None, Failed(data=permanent))


def test_the_cli_exits_2_with_the_arithmetic_before_any_ray_work(machine):
    from typer.testing import CliRunner

    from flows.cli import app

    result = CliRunner().invoke(app, ["train", "demo", "--set", "train.ray.gpus_per_worker=1"])
    assert result.exit_code == 2
    assert "asks for GPUs but this machine has none" in result.output


def ray_config(**values):
    from unirl_core.config.schema import RayConfig

    return RayConfig(**values)


def test_worker_env_takes_the_named_variables_from_the_driver(tmp_path):
    from unirl_core.distributed.worker_env import worker_env

    environ = {
        "UNIRL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": "sqlite:///x.db",
        "HF_HOME": "/models/hf", "SCORER_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": "aws-" + SECRET, "OTHER": "no",
    }  # fmt: skip
    config = ray_config(env_vars=["HF_HOME", "UNSET_ONE"], secret_env_vars=["AWS_SECRET_ACCESS_KEY"], working_dir=".")
    env = worker_env(config, ["SCORER_TOKEN"], environ)
    assert env.runtime_env() == {
        "env_vars": {"UNIRL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "HF_HOME": "/models/hf"},
        "working_dir": str(tmp_path.cwd().resolve()),
    }
    assert env.secrets == {
        "MLFLOW_TRACKING_URI": "sqlite:///x.db", "SCORER_TOKEN": SECRET, "AWS_SECRET_ACCESS_KEY": "aws-" + SECRET,
    }  # fmt: skip
    assert env.missing == ("UNSET_ONE",)
    # a credential listed as a plain env var stays a secret: never in Ray's runtime_env (Ray logs those values)
    both = worker_env(ray_config(env_vars=["SCORER_TOKEN"]), ["SCORER_TOKEN"], environ)
    assert "SCORER_TOKEN" not in both.runtime_env()["env_vars"] and both.secrets["SCORER_TOKEN"] == SECRET


def test_worker_env_resolves_the_default_workspace_on_the_driver(tmp_path, monkeypatch):
    """Without UNIRL_HOME a worker would resolve `./.unirl` in its raylet's folder: a second workspace."""
    from unirl_core.distributed.worker_env import worker_env

    monkeypatch.chdir(tmp_path)
    env = worker_env(ray_config(), [], {})
    assert env.runtime_env() == {"env_vars": {"UNIRL_HOME": str(tmp_path.resolve() / ".unirl")}}
    assert env.secrets == {}


def test_secret_values_stay_out_of_logs_params_and_the_printed_form(tmp_path, caplog, monkeypatch):
    from unirl_core.controller.round_plan import worker_credentials
    from unirl_core.distributed.worker_env import worker_env

    monkeypatch.setenv("SCORER_TOKEN", SECRET)
    config = train_config(
        tmp_path, "train.reward.remote={judge: {url: 'http://scorer:8000/score', auth_header_env: SCORER_TOKEN}}",
        "train.reward.weights={judge: 1.0}", "train.ray.secret_env_vars=[MISSING_TOKEN]",
    )  # fmt: skip
    assert worker_credentials(config) == ["SCORER_TOKEN"]
    with caplog.at_level(logging.DEBUG):
        env = worker_env(config.ray, worker_credentials(config), {"SCORER_TOKEN": SECRET})
        logging.getLogger("test").info("env %s %r", env, env)
    assert env.secrets == {"SCORER_TOKEN": SECRET}
    assert "MISSING_TOKEN" in caplog.text  # a listed name that is unset is named, with a warning
    params = json.dumps(config.model_dump(mode="json"))  # what the round logs as MLflow params
    for logged in (caplog.text, params, repr(env), str(env), json.dumps(env.describe())):
        assert SECRET not in logged
    assert env.describe()["secret_env_vars"] == ["SCORER_TOKEN"]


def test_env_var_names_that_look_like_secrets_are_refused_without_echoing_them(tmp_path):
    with pytest.raises(RecipeError) as info:
        train_config(tmp_path, f"train.ray.secret_env_vars=[Bearer {SECRET}]")
    assert "the NAME of an environment variable" in str(info.value) and SECRET not in str(info.value)


def test_dedicated_reward_actors_are_counted_with_the_workers(tmp_path, machine):
    """`train.reward.placement: dedicated` adds its actors' CPUs and GPUs to what the round asks, with the arithmetic
    and the keys to change; colocated rewards, or no model reward, ask nothing more."""
    from unirl_core.distributed.resources import shortfalls

    config = train_config(tmp_path, "train.ray.gpus_per_worker=1", "train.ray.address=ray-head:6379",
                          "train.reward.weights={clip_score: 1.0}", "train.reward.clip.model_path=/clip",
                          "train.reward.placement=dedicated", "train.reward.actors.workers=2",
                          "train.reward.actors.gpus_per_worker=0.5")  # fmt: skip
    assert shortfalls(config.ray, {"CPU": 64.0, "GPU": 3.0}, "the cluster", config.reward) == []  # 2 + 2 x 0.5
    assert shortfalls(config.ray, {"CPU": 64.0, "GPU": 2.0}, "the cluster", config.reward) == [
        "train.ray asks 2 GPUs and train.reward.actors 2 x 0.5 = 1 more, 3 GPUs in all, but the cluster has 2: lower "
        "train.reward.actors.workers or gpus_per_worker, or set train.reward.placement=colocated"
    ]
    from unirl_core.controller import TrainingConfigError, train_in_process

    local = config.model_copy(update={"ray": config.ray.model_copy(update={"workers": 1})})
    with pytest.raises(TrainingConfigError, match="dedicated serves the model rewards from Ray actors.*--local"):
        train_in_process(local)  # before any model or Ray
    colocated = config.reward.model_copy(update={"placement": "colocated"})
    assert shortfalls(config.ray, {"CPU": 64.0, "GPU": 2.0}, "the cluster", colocated) == []
    assert shortfalls(config.ray, {"CPU": 64.0, "GPU": 2.0}, "the cluster", None) == []
