"""`unirl eval` on the tiny SD3 model: a model trained on jpeg_compressibility against its base, scored on the same
prompts and noise, is ahead on the trained reward with an interval that excludes 0, the guard reported beside it;
a re-run scores only the missing shards and gives the same table; a checkpoint and its export score the same;
bad input is one line."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from flows.cli import app

pytestmark = pytest.mark.slow

PROMPTS = ["a red apple", "a blue car", "a dark night", "a bright sun", "a cat on a mat", "a pine tree"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The demo recipe trained for 6 RL steps on one rank (its checkpoint and export), and a prompt file."""
    root = tmp_path_factory.mktemp("eval")
    (root / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        patch.setenv("UNIRL_HOME", str(root / "home"))
        result = CliRunner().invoke(
            app, ["train", "demo", "--local", "--steps", "6", "--set", f"train.output_dir={root / 'run'}"]
        )
    assert result.exit_code == 0, result.output
    return root


def _eval(root, *args):
    return CliRunner().invoke(app, ["eval", *args, "--prompts", str(root / "prompts.txt"), "--shard-size", "4"])


def test_a_trained_model_is_ahead_of_its_base_with_an_interval_excluding_zero(
    trained, prefect_harness, mlflow_uri, tmp_path
):
    from mlflow.tracking import MlflowClient

    out = tmp_path / "eval"
    args = [str(trained / "run"), "--against", "tiny:sd3", "--recipe", "demo", "-r", "jpeg_compressibility",
            "-r", "brightness", "--out", str(out)]  # fmt: skip
    result = _eval(trained, *args)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    difference = {d["reward"]: d for d in summary["differences"]}
    assert difference["jpeg_compressibility"]["low"] > 0, summary  # trained on it: ahead, 0 outside the interval
    assert difference["jpeg_compressibility"]["n"] == len(PROMPTS)
    assert {(m["reward"], m["model"]) for m in summary["metrics"]} == {
        (r, m) for r in ("jpeg_compressibility", "brightness") for m in ("model", "against")
    }  # the guard beside the trained reward, for both models
    assert "jpeg_compressibility" in result.stdout and "model - against" in result.stdout
    assert "model: " in result.stdout and "(checkpoint, step 5)" in result.stdout
    results = pq.read_table(out / "results.parquet").to_pylist()
    assert len(results) == 2 * len(PROMPTS) and {r["prompt"] for r in results} == set(PROMPTS)
    assert len(list((out / "model" / "images").glob("*.png"))) == len(PROMPTS)

    client = MlflowClient(mlflow_uri)
    experiment = client.get_experiment_by_name("unirl-eval")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.metrics["jpeg_compressibility/difference/low"] == pytest.approx(
        difference["jpeg_compressibility"]["low"]
    )
    assert run.data.params["against"] == "tiny:sd3" and run.data.params["prompts_count"] == str(len(PROMPTS))
    logged = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.parquet", "summary.json", "best_and_worst.png"} <= logged

    # killed mid-way (shards commit one by one): the re-run scores the missing shards only, the same table
    before = (out / "summary.json").read_bytes()
    kept = out / "model" / "shards" / "00000.parquet"
    kept_stamp = kept.stat().st_mtime_ns
    for lost in (out / "model" / "shards" / "00001.parquet", out / "against" / "shards" / "00000.parquet"):
        lost.unlink()
    (out / "summary.json").unlink()
    again = _eval(trained, *args)
    assert again.exit_code == 0, (again.exception, again.output[-3000:])
    assert (out / "summary.json").read_bytes() == before
    assert kept.stat().st_mtime_ns == kept_stamp  # not scored again


def test_a_checkpoint_its_export_and_its_registered_version_score_the_same(trained, tmp_path, monkeypatch):
    from unirl_core.evaluation import run

    monkeypatch.setenv("UNIRL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{trained / 'mlflow.db'}")  # where training registered it
    scores = []
    for index, model in enumerate((trained / "run", trained / "run" / "export" / "step_00000005",
                                   "models:/unirl-demo@candidate")):  # fmt: skip
        spec = run.build_spec(str(model), prompts=str(trained / "prompts.txt"), rewards=["jpeg_compressibility"],
                              shard_size=8, output_dir=str(tmp_path / str(index)))  # fmt: skip
        for label, shard in run.prepare(spec):
            run.score_shard(spec, label, shard)
        scores.append(run.read_scores(spec, "model", len(PROMPTS))["jpeg_compressibility"])
    assert scores[0] == scores[1] == scores[2]
    assert spec.models[0].version == "1" and spec.models[0].step == 5

    # a model against itself in other shards and batches: every prompt starts from the same noise, difference 0
    spec = run.build_spec(str(trained / "run"), against=str(trained / "run" / "checkpoints"),
                          prompts=str(trained / "prompts.txt"), rewards=["jpeg_compressibility"], shard_size=4,
                          batch_size=3, output_dir=str(tmp_path / "self"))  # fmt: skip
    for label, shard in run.prepare(spec):
        run.score_shard(spec, label, shard)
    difference = run.finish(spec).differences[0]
    assert (difference["mean"], difference["low"], difference["high"]) == (0.0, 0.0, 0.0)
    # the same noise; the pixels only as equal as batched matrix products are (another batch size can take another
    # kernel: a last-bit difference moves a JPEG's size by a few bytes on some CPUs)
    assert run.read_scores(spec, "model", len(PROMPTS))["jpeg_compressibility"] == pytest.approx(scores[0], abs=5e-3)


def test_bad_input_is_one_line(trained, tmp_path, monkeypatch):
    monkeypatch.setenv("UNIRL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    cases = [
        (["tiny:sd3"], "needs the recipe"),
        ([str(trained / "run"), "-r", "no_such_reward"], "--reward no_such_reward"),
        ([str(tmp_path / "nothing_here")], "no committed checkpoint"),
        (["models:/no-such-model@champion"], "models:/no-such-model@champion: not found"),
    ]
    out = tmp_path / "taken"
    out.mkdir()
    (out / "spec.json").write_text(json.dumps({"identity": {"rewards": ["brightness"]}}))
    cases.append(([str(trained / "run"), "--out", str(out)], "holds another evaluation"))
    cases.append(([str(trained / "run"), "--out", str(trained / "prompts.txt")], "not a folder"))
    cases.append(([str(trained / "run"), "--against", "tiny:sd15", "--recipe", "demo", "--set",
                   "train.model.family=sd15"], "needs one family"))  # fmt: skip
    cases.append(([str(trained / "run"), "--device", "gpu"], "choose auto, cpu"))
    cases.append(([str(trained / "run"), "--set", "train.steps=1"], "pass --recipe RECIPE with it"))
    lost = tmp_path / "lost" / "step_00000001"
    lost.mkdir(parents=True)
    (lost / "trainer_state.json").write_text("{}")
    cases.append(([str(lost)], "no train_config.json"))

    from unirl_core.config import load_recipe
    from unirl_core.evaluation import run

    # a model's own settings are part of the evaluation: bf16 weights do not resume an fp32 evaluation's folder
    recipe = load_recipe("demo", [])
    fp32 = run.build_spec("tiny:sd3", recipe_train=recipe.train, prompts=str(trained / "prompts.txt"),
                          output_dir=str(tmp_path / "fp32"))  # fmt: skip
    run.prepare(fp32)
    cases.append((["tiny:sd3", "--recipe", "demo", "--set", "train.model.dtype=bfloat16", "--out",
                   str(tmp_path / "fp32")], "differs in models"))  # fmt: skip
    for args, message in cases:
        (tmp_path / "nothing_here").mkdir(exist_ok=True)
        result = _eval(trained, *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output, result.output


def test_unirl_eval_killed_mid_way_scores_only_the_missing_shards_again(prefect_harness, mlflow_uri, tmp_path):
    """`unirl eval` SIGKILLed (with its process group) once a few shards are committed, then run again: the shards
    committed before the kill are not scored again, and the table equals an evaluation never interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from prefect.settings import PREFECT_API_URL

    from unirl_core.evaluation import run

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"a photo of object number {i}\n" for i in range(64)))
    out = tmp_path / "eval"
    command = [str(Path(sys.executable).parent / "unirl"), "eval", "tiny:sd3", "--recipe", "demo", "--prompts",
               str(prompts), "-r", "jpeg_compressibility", "--shard-size", "2", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    process = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    shards = out / "model" / "shards"
    deadline = time.monotonic() + 300
    while len(list(shards.glob("*.parquet"))) < 3 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    committed = {p.name: p.stat().st_mtime_ns for p in shards.glob("*.parquet")}
    assert 3 <= len(committed) < 32, process.stdout.read()[-3000:]  # killed mid-way: some shards, not all
    assert not (out / "summary.json").exists()

    again = CliRunner().invoke(app, command[1:])  # the rerun in this process (the same Prefect API)
    assert again.exit_code == 0, again.output[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in shards.glob("*.parquet") if p.name in committed} == committed
    assert len(list(shards.glob("*.parquet"))) == 32

    whole = run.build_spec("tiny:sd3", prompts=str(prompts), rewards=["jpeg_compressibility"], shard_size=2,
                           output_dir=str(tmp_path / "whole"), recipe_train=_demo())  # fmt: skip
    for label, shard in run.prepare(whole):
        run.score_shard(whole, label, shard)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"] == run.finish(whole).metrics  # the same table as an evaluation never killed


def _demo():
    from unirl_core.config import load_recipe

    return load_recipe("demo").train
