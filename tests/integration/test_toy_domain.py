"""A domain is one package: tests/support/toy_domain (a tiny GPT-2 token policy with its own rollout, train step,
evaluation, grid and export), named in the recipe by `module:Class`, trained through `unirl train --local` and a
2-worker Ray round, checkpointed, resumed bitwise, exported and tracked in MLflow; no unirl file names it, and the
controller and the worker never ask which domain they run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pytest
import torch
from local_training import comparable
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.config import RecipeError, load_recipe
from unirl_core.tracking.mlflow_ui import metric_key

pytestmark = pytest.mark.slow

SUPPORT = Path(__file__).parents[1] / "support"
RECIPE = SUPPORT / "toy_domain" / "recipe.yaml"


class Killed(Exception):
    """Stands in for a kill after a step was logged."""


def rows_of(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def trained_weights(output_dir: Path) -> dict[str, torch.Tensor]:
    from unirl_core.worker.export import load_checkpoint_policy, resolve_checkpoint

    _, _, policy = load_checkpoint_policy(resolve_checkpoint(output_dir))
    return {k: v.clone() for k, v in policy.trainable.state_dict().items()}


def test_unirl_train_local_trains_evaluates_exports_and_registers_the_token_policy(tmp_path, mlflow_uri):
    from transformers import GPT2LMHeadModel

    out = tmp_path / "out"
    sets = [f"train.output_dir={out}", "train.eval_every_rounds=1", "train.eval_prompts=2"]
    result = CliRunner().invoke(app, ["train", str(RECIPE), "--local", *sum((["--set", s] for s in sets), [])])
    assert result.exit_code == 0, result.output
    assert "training toy_domain:TokenDomain: 1 round " in result.output
    rows = rows_of(out)
    assert [row["step"] for row in rows] == list(range(8))
    first, last = (sum(row["reward_mean"] for row in part) / 4 for part in (rows[:4], rows[4:]))
    print(f"toy domain, 8 steps: reward_mean {first:.3f} (steps 0-3) -> {last:.3f} (steps 4-7)")
    assert last > first + 0.1  # it learns to emit the rewarded token
    assert (out / "samples" / "round_000_step_00000007.png").is_file()
    assert (out / "samples" / "eval_step_00000007.png").is_file()

    export = out / "export" / "step_00000007"
    loaded = GPT2LMHeadModel.from_pretrained(export)  # the domain's export loads with transformers alone
    trained = trained_weights(out)
    assert all(torch.equal(v, trained[k]) for k, v in loaded.state_dict().items())
    assert json.loads((export / "unirl_export.json").read_text())["merged"] is True

    client = mlflow.MlflowClient(mlflow_uri)
    (version,) = client.search_model_versions("name='unirl-recipe'")
    assert version.tags["family"] == "toy_tokens"
    history = client.get_metric_history(version.run_id, metric_key("reward_mean"))
    assert [(m.step, m.value) for m in history] == [(row["step"], row["reward_mean"]) for row in rows]
    assert client.get_run(version.run_id).data.params["domain.name"] == "toy_domain:TokenDomain"


def test_a_two_worker_ray_round_checkpoints_and_resumes_bitwise(ray_local, tmp_path, mlflow_uri, monkeypatch):
    """Workers import the domain as any recipe's own code: its folder on PYTHONPATH, forwarded by `ray.env_vars`."""
    from unirl_core.controller import plan_rounds, run_round

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]))
    sets = ["train.steps=4", "train.checkpoint_every=1", "train.ray.workers=2", "train.ray.cpus_per_worker=1",
            "train.ray.env_vars=[PYTHONPATH]"]  # fmt: skip

    def config(name: str):
        return load_recipe(RECIPE, [*sets, f"train.output_dir={tmp_path / name}"]).train

    def train(name: str, on_step=None) -> None:
        for round_ in plan_rounds(config(name)):
            run_round(config(name), round_, run_name=name, on_step=on_step)

    def kill_at_step_2(row):
        if row["step"] == 2:
            raise Killed

    train("straight")
    with pytest.raises(Killed):  # steps 0-1 committed, step 2 logged and lost
        train("resumed", on_step=kill_at_step_2)
    train("resumed")
    straight, resumed = rows_of(tmp_path / "straight"), rows_of(tmp_path / "resumed")
    assert [row["step"] for row in resumed] == [0, 1, 2, 3]  # step 2's lost row was dropped before it ran again
    assert comparable(resumed) == comparable(straight)  # every reward, loss, ratio, grad norm and lr
    expected, got = trained_weights(tmp_path / "straight"), trained_weights(tmp_path / "resumed")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)

    client = mlflow.MlflowClient(mlflow_uri)
    (run,) = client.search_runs(client.get_experiment_by_name("unirl").experiment_id, "run_name = 'resumed'")
    assert [m.step for m in client.get_metric_history(run.info.run_id, metric_key("reward_mean"))] == [
        0,
        1,
        2,
        3,
    ]  # once each


def test_the_domain_refuses_what_it_cannot_train():
    with pytest.raises(RecipeError) as bad:
        load_recipe(RECIPE, ["train.reward.guards=[brightness]", "train.warmup.steps=2", "train.domain.vocab=9"])
    message = str(bad.value)
    assert "train.domain.vocab" in message and "did you mean 'vocab_size'" in message
    with pytest.raises(RecipeError) as bad:
        load_recipe(RECIPE, ["train.reward.guards=[brightness]", "train.warmup.steps=2"])
    message = str(bad.value)
    assert "train.reward.weights.brightness" in message and "train.warmup.steps" in message
    with pytest.raises(RecipeError) as unknown:
        load_recipe(RECIPE, ["train.domain.name=toy_domain:Nothing"])
    assert "domain 'toy_domain:Nothing' cannot be imported" in str(unknown.value)


def test_no_unirl_file_names_the_toy_domain():
    root = Path(__file__).parents[2]
    named = [str(path.relative_to(root)) for folder in ("unirl_core", "flows", "tasks")
             for path in (root / folder).rglob("*.py") if "toy_domain" in path.read_text()]  # fmt: skip
    assert named == []
