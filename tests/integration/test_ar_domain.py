"""The autoregressive domain through the same round lifecycle as diffusion (the controller, checkpoints, MLflow,
export, registration), on the tiny Qwen3: token GRPO raises the demo task's reward on seeds 0-2 by the suite's
learning criterion (tests/support/learning.py), the first update's ratio is exactly 1, a run stopped mid-way
resumes to the uninterrupted result bitwise, every token algorithm trains, and the export loads with transformers
(and peft for a LoRA adapter)."""

from __future__ import annotations

from pathlib import Path

import pytest
from learning import assert_learns, gains_over_seeds
from local_training import comparable, train_locally
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.config import load_recipe

pytestmark = pytest.mark.slow


DENSE = "train.reward.weights={'text_rewards:digit_fraction': 1.0}"  # tests/support/text_rewards.py


class Killed(Exception):
    """Stands in for a kill: raised after a step was logged, before anything later is committed."""


def test_dapo_raises_the_vlm_demos_reward(tmp_path, monkeypatch):
    """`demo_vlm`: the tiny Qwen2.5-VL answering "How many dots?" about pictures (the `counting` source) gains more
    than the suite's margin over 16 DAPO steps on seed 0 (seeds 0-2 measured: docs/autoregressive.md)."""
    from learning import MARGIN, reward_gain

    monkeypatch.setenv("UNIRL_HOME", str(tmp_path / "home"))  # the source draws its pictures into the workspace
    gain, rows = reward_gain([], 0, tmp_path / "run", recipe="demo_vlm")
    assert gain > MARGIN, [round(row["reward_mean"], 3) for row in rows]
    assert rows[0]["ratio_mean"] == 1.0 and all(0 < row["response_length_mean"] <= 2 for row in rows)


def test_token_grpo_raises_the_demo_tasks_reward_on_three_seeds(tmp_path):
    gains, runs = gains_over_seeds([], tmp_path, recipe="demo_llm")
    assert_learns(gains, runs)
    for rows in runs:
        assert rows[0]["ratio_mean"] == 1.0 and rows[0]["clip_fraction"] == 0.0
        assert all(0 < row["response_length_mean"] <= 2 for row in rows)


@pytest.mark.parametrize("algorithm", ["dapo", "dr_grpo", "gspo", "token_grpo_lora_kl"])
def test_each_token_algorithm_trains_and_a_stopped_run_resumes_exactly(algorithm, tmp_path):
    overrides = [f"train.algorithm.name={algorithm}"]
    if algorithm == "dapo":  # pi_old recomputed before two mini-batch updates: the second one's ratios move off 1
        overrides.append("train.algorithm.num_updates_per_batch=2")
    if algorithm == "token_grpo_lora_kl":  # the reference policy is the model with its adapter disabled
        overrides = ["train.algorithm.name=token_grpo", "train.algorithm.beta=0.04",
                     "train.model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}",
                     "train.algorithm.learning_rate=0.05"]  # fmt: skip
    config = load_recipe("demo_llm", ["train.steps=4", "train.checkpoint_every=2", "train.domain.max_new_tokens=4",
                                      "train.sampling.seed=1", DENSE, "train.reward.guards=[]", *overrides]).train  # fmt: skip
    rows = train_locally(config, tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1, 2, 3]
    assert (rows[0]["ratio_mean"] == 1.0) == (algorithm != "dapo") and all(row["grad_norm"] > 0 for row in rows)
    if algorithm == "token_grpo_lora_kl":
        assert rows[0]["kl"] == 0.0 and rows[-1]["kl"] > 0  # the adapter starts at zero, then moves away
    first: list[dict] = []

    def kill_at_2(row: dict) -> None:
        first.append(row)
        if row["step"] == 2:
            raise Killed

    with pytest.raises(Killed):  # steps 0-2 logged, step 1 committed
        train_locally(config, tmp_path / "killed", on_step=kill_at_2)
    resumed = train_locally(config, tmp_path / "killed")
    assert [row["step"] for row in resumed] == [2, 3]
    assert comparable(first[:2] + resumed) == comparable(rows)


def test_dapos_dynamic_sampling_trains_on_groups_whose_rewards_differ_and_resumes_exactly(tmp_path):
    """demo_llm's sparse rewards (at first most groups score all 0) with DAPO's dynamic sampling: a step rolls out
    more prompts until 4 groups differ, trains on those alone (no group of equal rewards counted), and a run stopped
    mid-way resumes to the uninterrupted one bitwise (the extra prompts drawn are in the source's state); with
    too few rollouts allowed, the step stops naming the key."""
    from unirl_core.controller.rounds import DynamicSamplingError

    overrides = ["train.algorithm.name=dapo", "train.algorithm.max_gen_batches=0", "train.steps=4",
                 "train.checkpoint_every=2", "train.reward.guards=[]"]  # fmt: skip
    config = load_recipe("demo_llm", overrides).train
    rows = train_locally(config, tmp_path / "run")
    assert rows[0]["gen_batches"] > 1 and all(row["zero_std_ratio"] == 0 and row["reward_std"] > 0 for row in rows)
    first: list[dict] = []

    def kill_at_2(row: dict) -> None:
        first.append(row)
        if row["step"] == 2:
            raise Killed

    with pytest.raises(Killed):
        train_locally(config, tmp_path / "killed", on_step=kill_at_2)
    resumed = train_locally(config, tmp_path / "killed")
    assert comparable(first[:2] + resumed) == comparable(rows)
    strict = load_recipe("demo_llm", [*overrides, "train.algorithm.max_gen_batches=1"]).train
    with pytest.raises(DynamicSamplingError, match=r"after train.algorithm.max_gen_batches=1 rollouts"):
        train_locally(strict, tmp_path / "strict")


def test_unirl_train_demo_llm_sigkilled_resumes_to_the_uninterrupted_run_bitwise(tmp_path, mlflow_uri):
    """`unirl train demo_llm --local`, SIGKILLed once its first checkpoint is committed, then run again: every
    step's metrics equal those of the run never interrupted (the rows of steps run twice: the last logged; dynamic
    sampling's resume: test_dapos_dynamic_sampling_...)."""
    from sigkill import killed_then_rerun

    sets = ["train.reward.guards=[]"]
    config = load_recipe("demo_llm", [*sets, "train.steps=4", "train.checkpoint_every=2"]).train
    straight = train_locally(config, tmp_path / "straight")
    assert killed_then_rerun("demo_llm", sets, tmp_path / "killed") == comparable(straight)


def test_unirl_train_demo_llm_local_exports_a_model_transformers_loads_and_unirl_eval_scores_it(
    prefect_harness, mlflow_uri, tmp_path
):
    import json

    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = CliRunner().invoke(app, ["train", "demo_llm", "--local", "--steps", "2", "--set",
                                      f"train.output_dir={tmp_path}/out"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "training causal LM (tiny:qwen3)" in result.stdout and "rl round 0: steps 0-1" in result.stdout
    assert "txt/s" in result.stdout and "img/s" not in result.stdout  # completions per second
    assert "registered model: unirl-demo_llm version" in result.stdout
    export = tmp_path / "out" / "export" / "step_00000001"
    model, tokenizer = AutoModelForCausalLM.from_pretrained(export), AutoTokenizer.from_pretrained(export)
    ids = tokenizer("3+4=", return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape[1] >= ids.shape[1] + 1
    assert (tmp_path / "out" / "samples" / "round_000_step_00000001.png").stat().st_size > 0

    records = [{"prompt": f"{a}+{b}=", "metadata": {"answer": str(a + b), "pattern": r"\d+"}} for a, b in
               [(1, 2), (3, 4), (0, 0), (2, 2), (5, 1)]]  # fmt: skip
    (tmp_path / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    scored = CliRunner().invoke(app, ["eval", str(tmp_path / "out"), "--prompts", str(tmp_path / "sums.jsonl"),
                                      "--out", str(tmp_path / "eval")])  # fmt: skip
    assert scored.exit_code == 0, scored.output
    assert "(completions, seed 0)" in scored.stdout and "math_verify" in scored.stdout
    results = pq.read_table(tmp_path / "eval" / "results.parquet").to_pydict()
    assert len(results["prompt"]) == 5 and {"output", "math_verify", "regex_match"} <= results.keys()
    greedy = (tmp_path / "eval" / "model" / "images" / "000001.txt").read_text()
    assert greedy == results["output"][1]  # each completion is kept as text too


def test_a_lora_export_is_a_peft_adapter_on_the_base_folder(tmp_path):
    from peft import AutoPeftModelForCausalLM

    from unirl_core.controller import plan_rounds  # noqa: F401 (the round's own export path below)

    lora = "train.model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}"
    result = CliRunner().invoke(app, ["train", "demo_llm", "--local", "--steps", "1", "--set", lora, "--set",
                                      f"train.output_dir={tmp_path}/out"])  # fmt: skip
    assert result.exit_code == 0, result.output
    export = tmp_path / "out" / "export" / "step_00000000"
    assert (export / "adapter_model.safetensors").is_file() and (export / "adapter_config.json").is_file()
    model = AutoPeftModelForCausalLM.from_pretrained(export)
    assert model.peft_config["default"].r == 4


def test_one_and_two_ray_workers_give_the_same_rewards_and_updates(ray_local, tmp_path, monkeypatch):
    """Sample i's draws come from (seed, step, sample id) alone, and DAPO's token mean divides by the tokens of both
    ranks (one all-reduce): one rank in this process and 2 FSDP2 workers on Ray take the same steps."""
    import json
    import os

    support = Path(__file__).resolve().parents[1] / "support"  # the workers import the dense reward from there
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(support), os.environ.get("PYTHONPATH", "")]))

    from unirl_core.controller import METRICS_FILE, output_dir, plan_rounds, run_round

    config = load_recipe("demo_llm", ["train.steps=3", "train.domain.max_new_tokens=4", "train.algorithm.name=dapo",
                                      DENSE, "train.reward.guards=[]", "train.ray.env_vars=[PYTHONPATH]"]).train  # fmt: skip
    one = train_locally(config, tmp_path / "one", cpus_per_worker=1)
    two_config = config.model_copy(update={"output_dir": str(tmp_path / "two"),
                                           "ray": config.ray.model_copy(update={"workers": 2})})  # fmt: skip
    for round_ in plan_rounds(two_config):
        run_round(two_config, round_)
    two = [json.loads(line) for line in (output_dir(two_config) / METRICS_FILE).read_text().splitlines()]
    assert [r["reward_mean"] for r in one] == [r["reward_mean"] for r in two]  # bitwise, every step
    assert [r["response_length_mean"] for r in one] == [r["response_length_mean"] for r in two]
    for key in ("loss", "grad_norm", "entropy", "ratio_mean", "clip_fraction"):
        largest = max(abs(a[key] - b[key]) for a, b in zip(one, two, strict=True))
        assert largest <= 1e-5 * max(abs(a[key]) for a in one) + 1e-8, (key, largest)  # summation order only


def test_a_rounds_last_samples_are_a_table_of_prompts_completions_and_rewards(mlflow_uri, tmp_path):
    import json

    from mlflow import MlflowClient

    config = load_recipe("demo_llm", ["train.steps=1", "train.domain.max_new_tokens=3"]).train
    train_locally(config, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run/samples/round_000_step_00000000.jsonl").open()]
    assert len(rows) == config.grid_prompts * min(config.grid_images_per_prompt, 8)
    assert {"prompt", "sample_id", "output", "math_verify", "regex_match", "exact_match", "total"} <= rows[0].keys()
    assert all(r["total"] == r["math_verify"] + 0.5 * r["regex_match"] for r in rows)
    client = MlflowClient(mlflow_uri)
    run = client.search_runs([client.get_experiment_by_name("unirl").experiment_id])[0]
    folder = client.download_artifacts(run.info.run_id, "samples/round_000.json", str(tmp_path))
    table = json.loads(Path(folder).read_text())
    assert table["columns"][:3] == ["prompt", "sample_id", "output"] and len(table["data"]) == len(rows)


def test_dapos_overlong_shaping_costs_the_last_buffer_tokens_linearly(mlflow_uri, tmp_path):
    """DAPO's soft overlong punishment (its numbers: 0 up to 16384 of 20480 tokens, -0.5 at 18432, -1 at 20480), and
    in a round: the `overlong` term of each completion by its length, added to the total."""
    import json

    from unirl_core.domains.ar.domain import overlong_terms

    assert overlong_terms([100, 16384, 18432, 20480], 20480, 4096, 1.0) == [0.0, 0.0, -0.5, -1.0]
    config = load_recipe("demo_llm", ["train.steps=1", "train.domain.max_new_tokens=4", "train.domain.overlong_buffer=2",
                                      "train.grid_images_per_prompt=8"]).train  # fmt: skip
    rows = train_locally(config, tmp_path / "run")
    table = [json.loads(line) for line in (tmp_path / "run/samples/round_000_step_00000000.jsonl").open()]
    assert {row["overlong"] for row in table} <= {0.0, -0.5, -1.0} and min(row["overlong"] for row in table) < 0
    assert all(r["total"] == r["math_verify"] + 0.5 * r["regex_match"] + r["overlong"] for r in table)
    assert rows[0]["reward_overlong_mean"] == sum(r["overlong"] for r in table) / len(table)  # the grid is all 32
    with pytest.raises(Exception, match="train.domain.overlong_buffer: got 4; fewer than domain.max_new_tokens"):
        load_recipe("demo_llm", ["train.domain.max_new_tokens=4", "train.domain.overlong_buffer=4"])


@pytest.mark.parametrize("model, size", [("tiny:llava", 32), ("tiny:qwen2_5_vl", 56)])
def test_a_vlm_trains_on_prompts_with_condition_images(model, size, tmp_path):
    """The tiny LLaVA and the tiny Qwen2.5-VL (3-D rotary positions) on a prompt file whose records carry an image
    (`media_refs` role condition), loaded as a rollout's condition images are: the round trains on them, the first
    update's ratio exactly 1 (that an image reaches the tokens, and the log-probs with images:
    tests/unit/domains/test_ar_policy.py)."""
    import json

    from PIL import Image

    records = []
    for i, colour in enumerate(["red", "blue", "green", "white"]):
        Image.new("RGB", (40, 40), colour).save(tmp_path / f"{colour}.png")
        records.append({"prompt": f"{i}+1=", "metadata": {"answer": str(i + 1), "pattern": r"\d+"},
                        "media_refs": [{"modality": "image", "role": "condition", "uri": str(tmp_path / f"{colour}.png")}]})  # fmt: skip
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = load_recipe("demo_llm", [f"train.model.path={model}", "train.data.source=file", "train.steps=2",
                                      f"train.data.data_path={tmp_path / 'prompts.jsonl'}", f"train.domain.image_size={size}",
                                      "train.domain.max_new_tokens=4", DENSE, "train.reward.guards=[]"]).train  # fmt: skip
    rows = train_locally(config, tmp_path / "run")
    assert [row["step"] for row in rows] == [0, 1] and all(row["grad_norm"] > 0 for row in rows)
    assert rows[0]["ratio_mean"] == 1.0
