"""The `unirl` commands that need no orchestration, run in-process through the real typer app."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app

runner = CliRunner()


def run(*args: str, env: dict | None = None):
    return runner.invoke(app, list(args), env=env)


def test_validate_prints_resolved_yaml():
    result = run("validate", "demo", "--set", "train.sampling.height=64")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.stdout)
    assert resolved["train"]["sampling"]["height"] == 64
    assert resolved["train"]["data"]["prompts_per_rollout"] == 2


def test_validate_reports_every_error_and_exits_2():
    result = run("validate", "prompts_file", "--set", "train.data.prompt_key=", "-s", "train.sampling.widht=64")
    assert result.exit_code == 2
    assert "train.data.data_path: got '${env:DATA_PATH}'; environment variable DATA_PATH is not set" in result.stderr
    result = run("validate", "demo", "-s", "train.sampling.widht=64", "-s", "train.sampling.height=7")
    assert result.exit_code == 2
    assert "train.sampling.widht: got '64'; unknown key; did you mean 'width'?" in result.stderr
    assert "train.sampling.height: got '7'; Input should be a multiple of 8" in result.stderr
    assert result.stdout == ""


def test_validate_refuses_what_train_would_refuse_from_the_recipe_alone():
    """3 GRPO groups cannot divide over 2 workers: `validate` says so with the arithmetic, as `train` does."""
    result = run("validate", "demo", "--set", "train.data.prompts_per_rollout=3")
    assert result.exit_code == 2 and result.stdout == ""
    assert (
        "training cannot start:" in result.stderr and "3 groups must divide over 2 workers (3 % 2 = 1)" in result.stderr
    )


def test_validate_refuses_a_model_folder_the_family_cannot_load(tmp_path):
    """`train.model.path` is checked from the folder's model_index.json and subfolders (no weights read): a wrong
    path, a folder that is not a pipeline, another family's pipeline, a missing component, a tiny of another
    family, a hub id not in the cache. Each is one line naming the key and what to do."""
    from unirl_core.models.registry import resolve_model_path

    def refused(path: str, *more: str) -> str:
        result = run("validate", "demo", "--set", f"train.model.path={path}", *more)
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert "Traceback" not in result.output
        return result.stderr

    assert "train.model.path: '/no/such/sd35' is not a folder; point it at a diffusers StableDiffusion3Pipeline " \
        "folder (model_index.json, transformer/, vae/, ...)" in refused("/no/such/sd35")  # fmt: skip
    assert f"{str(tmp_path)!r} has no model_index.json, so it is not a diffusers" in refused(str(tmp_path))
    sd15 = resolve_model_path("tiny:sd15")
    assert "is a StableDiffusionPipeline folder but family 'sd3' loads StableDiffusion3Pipeline; set " \
        "train.model.family" in refused(sd15)  # fmt: skip
    broken = tmp_path / "broken"
    (broken / "vae").mkdir(parents=True)
    (broken / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "SD3Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"], "text_encoder": [None, None]}))  # fmt: skip
    assert f"train.model.path: {str(broken)!r} lacks transformer/ (a complete" in refused(str(broken))
    assert "'tiny:sd15' is the tiny sd15 model but train.model.family is 'sd3'; use tiny:sd3" in refused("tiny:sd15")
    assert "'nobody/not-a-model' is neither a local folder nor in the Hugging Face cache; download it" in refused(
        "nobody/not-a-model"
    )
    assert run("validate", "demo", "--set", f"train.model.path={resolve_model_path('tiny:sd3')}").exit_code == 0


def test_a_full_or_read_only_disk_is_one_error_line_naming_the_path(monkeypatch, tmp_path):
    """An OSError no retry can fix, raised anywhere under a command, is printed like a UserError (simulated here:
    `load_recipe` raising ENOSPC for a path; the real disk-full runs are tests/e2e/test_disk_full.py)."""
    import errno

    import unirl_core.config

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.tmp"))

    monkeypatch.setattr(unirl_core.config, "load_recipe", full)
    result = run("validate", "demo")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        result.stderr
        == f"error: {tmp_path / 'x.tmp'}: no space left on the device: free space there or point the output at a larger disk\n"
    )


def test_recipes_lists_packaged_recipes():
    result = run("recipes")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["recipe", "description"]
    assert max(len(line.rstrip()) for line in lines) <= 80  # descriptions wrapped at word boundaries, not mid-word
    assert "openai/clip-vit-large-patch14" in result.stdout.replace("\n", " ")
    assert [line.split()[0] for line in lines[1:] if not line.startswith(" ")] == [
        "demo",
        "demo_dancegrpo",
        "demo_diffusion_nft",
        "demo_flow_dppo",
        "demo_flow_grpo_fast",
        "demo_grpo_guard",
        "demo_llm",
        "demo_mixgrpo",
        "demo_mixgrpo_flash",
        "demo_video",
        "demo_vlm",
        "flux2_klein_grpo",
        "flux_dev_grpo",
        "flux_kontext_grpo",
        "flux_ocr_grpo",
        "hunyuan_video15_grpo",
        "ingest_parquet",
        "pipeline_demo",
        "pipeline_video",
        "prompts_file",
        "qwen2_5_vl_7b_grpo",
        "qwen3_8b_grpo",
        "qwen_image_edit_grpo",
        "qwen_image_grpo",
        "sd35_geneval_grpo",
        "sd35_large_grpo",
        "sd35_medium_dancegrpo",
        "sd35_medium_diffusion_nft",
        "sd35_medium_flow_dppo",
        "sd35_medium_flow_grpo_fast",
        "sd35_medium_grpo",
        "sd35_medium_grpo_guard",
        "sd35_medium_mixgrpo",
        "sd35_medium_mixgrpo_flash",
        "sd35_pickscore_grpo",
        "sdxl_ddpo",
        "wan2_1_i2v_grpo",
        "wan2_1_t2v_ocr_grpo",
        "wan2_2_t2v_a14b_grpo",
        "wan2_2_ti2v_5b_grpo",
    ]


@pytest.fixture
def seed_files(tmp_path):
    (tmp_path / "frames").mkdir()
    rows = [
        {"prompt": "A watercolor landscape with snowy mountains at sunrise.", "style": "watercolor"},
        {
            "prompt": "Animate this scene with gentle falling snow.",
            "media_refs": [{"modality": "image", "role": "condition", "uri": "frames/scene_01.png"}],
        },
        {"caption": "A cinematic portrait of a robot reading under warm light.", "metadata": {"src": "x"}},
    ]
    good = tmp_path / "prompts.json"
    good.write_text(json.dumps(rows))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "x", "seed": 3}\n')
    return good, bad


def test_prompts_show_prints_normalized_json_lines(seed_files, tmp_path):
    good, _ = seed_files
    result = run("prompts", "show", str(good))
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt_id"] for r in rows] == ["prompts.json:0", "prompts.json:1", "prompts.json:2"]
    assert rows[0]["metadata"] == {"style": "watercolor"}
    assert rows[1]["media_refs"] == [
        {"modality": "image", "role": "condition", "uri": str(tmp_path / "frames" / "scene_01.png")}
    ]
    assert rows[2]["prompt"].startswith("A cinematic") and rows[2]["metadata"] == {"src": "x"}
    assert result.stderr.strip() == f"3 prompts from {good}"


def test_prompts_show_limit_and_groups(seed_files):
    good, _ = seed_files
    result = run("prompts", "show", str(good), "--limit", "2", "--samples-per-prompt", "3")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["group_id"], r["sample_id"]) for r in rows] == [
        (0, "prompt:0:sample:0"),
        (0, "prompt:0:sample:1"),
        (0, "prompt:0:sample:2"),
        (1, "prompt:1:sample:0"),
        (1, "prompt:1:sample:1"),
        (1, "prompt:1:sample:2"),
    ]
    assert rows[3]["prompt_id"] == "prompts.json:1"
    assert "2 of 3 prompts x 3 = 6 samples" in result.stderr


def test_prompts_show_fails_cleanly_on_bad_input(seed_files, tmp_path):
    _, bad = seed_files
    result = run("prompts", "show", str(bad))
    assert result.exit_code == 2
    assert f"error: {bad}, line 2: row field(s) ['seed'] try to set sampling" in result.stderr
    assert "train.sampling.seed" in result.stderr and result.stdout == ""
    (tmp_path / "p.yaml").write_text("- a")
    result = run("prompts", "show", str(tmp_path / "p.yaml"))
    assert result.exit_code == 2 and "use one of .txt, .jsonl, .json" in result.stderr


def assert_one_error_line(result, message: str) -> None:
    """Exit 2; stderr has exactly one `error:` line (a recipe's issues follow it, indented), no traceback."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # a clean exit, not an exception escaping the command
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[0]], result.stderr
    assert all(line.startswith("  ") for line in lines[1:]), result.stderr
    assert message in result.stderr and "Traceback" not in result.output
    assert result.stdout == ""


def test_a_user_error_raised_by_the_core_is_one_error_line_and_exit_2(tmp_path):
    """No command lists the errors it expects: the app catches every UserError (RecipeError, PromptDataError,
    DatasetNotFound, CheckpointError, TrainingConfigError, ...) in one place."""
    result = run("validate", "demo", "--set", "train.sampling.height=7")
    assert_one_error_line(result, "train.sampling.height: got '7'; Input should be a multiple of 8")
    assert result.stderr.startswith("error: recipe ") and "1 error(s)" in result.stderr
    result = run("prompts", "show", str(tmp_path / "missing.txt"))
    assert_one_error_line(result, f"error: {tmp_path / 'missing.txt'}: no such prompt file")
    result = run("shards", "inspect", str(tmp_path))
    assert_one_error_line(result, f"error: {tmp_path}: no index.json here")
    result = run("export", str(tmp_path), str(tmp_path / "out"))
    assert_one_error_line(result, f"error: {tmp_path}: no committed checkpoint")
    # through a command that runs flows: refused by the core's checks before any Prefect or Ray work
    result = run("train", "prompts_file", env={"DATA_PATH": str(tmp_path / "missing.txt")})
    assert_one_error_line(result, f"training cannot start: train.data: {tmp_path / 'missing.txt'}: no such prompt")


def test_an_unexpected_error_is_one_line_naming_its_type_and_verbose_shows_the_traceback(monkeypatch):
    """A bug is not dressed as a user error (exit 1, its exception type named) but is not a wall of traceback
    either: one line and a hint; `--verbose` lets it escape with its traceback."""
    import unirl_core.config

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(unirl_core.config, "load_recipe", broken)
    result = run("validate", "demo")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.stderr.splitlines() == ["error: KeyError: 'a bug'", "  `unirl --verbose ...` prints the traceback"]
    result = run("--verbose", "validate", "demo")
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)
    assert "error:" not in result.stderr


def test_tiny_models_refuses_unknown_family_and_non_empty_folder(tmp_path):
    from unirl_core.models.registry import family_names

    result = run("tiny-models", str(tmp_path / "m"), "--family", "sd4")
    assert result.exit_code == 2
    assert f"model family 'sd4' is unknown: choose one of {', '.join(family_names())}" in result.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    result = run("tiny-models", str(tmp_path / "full"))
    assert result.exit_code == 2 and "is not an empty folder" in result.stderr
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def test_families_lists_every_family_and_demo_refuses_an_unknown_one():
    from unirl_core.models.registry import family_class, family_names

    result = run("families")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert sorted(rows) == family_names() and "StableDiffusionPipeline" in rows["sd15"]
    assert family_class("sd15").sampler in result.stdout and "image-to-image" in result.stdout
    result = run("demo", "--family", "sd4")
    assert result.exit_code == 2 and "--family: model family 'sd4' is unknown" in result.stderr


def test_demo_of_another_family_has_its_own_outputs_and_registered_model(monkeypatch, tmp_path):
    """`unirl demo --family flux` after `unirl demo`: its own dataset, run folder and model name, never the SD3
    run's (whose checkpoints another family could not resume). The pipeline itself is not run here (replaced by a
    recorder; tests/integration/test_family_chains.py runs the chain on every family)."""
    import flows.cli

    recipes = []
    monkeypatch.setenv("UNIRL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(flows.cli, "_run_pipeline", recipes.append)
    for family in ("sd3", "flux"):
        assert run("demo", "--family", family, "--rows", "8").exit_code == 0
    sd3, flux = recipes
    assert (sd3.name, flux.name) == ("pipeline_demo", "pipeline_demo_flux")
    assert flux.train.model.family == "flux" and flux.train.output_dir.endswith("outputs/pipeline_demo_flux")
    assert sd3.ingest.dataset_output_root != flux.ingest.dataset_output_root


def test_workspace_follows_unirl_home(tmp_path):
    result = run("workspace", env={"UNIRL_HOME": str(tmp_path / "ws"), "MLFLOW_TRACKING_URI": ""})
    assert result.exit_code == 0, result.output
    assert f"sqlite:///{tmp_path / 'ws' / 'mlflow.db'}" in result.stdout


def test_schema_is_the_recipe_json_schema():
    result = run("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"name", "description", "ingest", "precache", "train", "promote"}


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout.startswith("unirl ")
