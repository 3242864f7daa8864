"""Typed recipes: packaged recipes resolve, typos and bad values fail with their dotted paths."""

from __future__ import annotations

import pytest
import yaml

from unirl_core.config import Recipe, RecipeError, dump_resolved, load_recipe, packaged_recipes, recipe_from_tree

ENV = {
    "DATA_PATH": "/data/prompts.jsonl",
    "INPUT_PARQUET": "/data/part-*.parquet",
    "MODEL_PATH": "/models/pipeline",
    "CLIP_PATH": "/models/clip",
    **{
        name: f"/models/{name.lower()}"
        for name in (
            "PICKSCORE_PATH",
            "CLIP_H_PATH",
            "IMAGEREWARD_PATH",
            "BERT_PATH",
            "OWLV2_PATH",
            "OCR_PATH",
            "VIDEO_JUDGE_PATH",
        )
    },  # fmt: skip
}


def issues_of(exc: RecipeError) -> dict[str, str]:
    return {issue.path: str(issue) for issue in exc.issues}


@pytest.mark.parametrize("name", sorted(packaged_recipes()))
def test_every_packaged_recipe_resolves_and_round_trips(name):
    recipe = load_recipe(name, env=ENV)
    assert recipe.name == name and (recipe.train or recipe.ingest)
    resolved = dump_resolved(recipe)
    assert "${env:" not in resolved
    assert Recipe.model_validate(yaml.safe_load(resolved)) == recipe


def test_packaged_prompts_recipe_reads_env_with_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("UNIRL_HOME", str(tmp_path))
    recipe = load_recipe("prompts_file", env={"DATA_PATH": "s3://b/p.json", "OUTPUT_DIR": "/runs/1"})
    assert recipe.train.data.data_path == "s3://b/p.json"
    assert recipe.train.output_dir == "/runs/1"
    assert recipe.train.data.eval_data_path is None  # ${env:EVAL_DATA_PATH,} with the variable unset
    # OUTPUT_DIR unset: the workspace's outputs folder, spelled out in the resolved recipe
    assert load_recipe("prompts_file", env=ENV).train.output_dir == str(tmp_path / "outputs" / "prompts_file")


def test_missing_env_variable_names_it_and_the_fix():
    with pytest.raises(RecipeError) as info:
        load_recipe("prompts_file", env={})
    assert "environment variable DATA_PATH is not set" in issues_of(info.value)["train.data.data_path"]


def test_typo_key_in_file_fails_with_dotted_path_and_suggestion(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train:\n  data:\n    source: smoke\n    prompts_per_rolout: 4\n  sampling:\n    hieght: 64\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    found = issues_of(info.value)
    assert "did you mean 'prompts_per_rollout'" in found["train.data.prompts_per_rolout"]
    assert "did you mean 'height'" in found["train.sampling.hieght"]
    assert str(path) in str(info.value) and "2 error(s)" in str(info.value)


def test_typo_section_is_refused():
    with pytest.raises(RecipeError) as info:
        recipe_from_tree({"trian": {}})
    assert "did you mean 'train'" in issues_of(info.value)["trian"]


def test_overrides_are_typed_by_the_models():
    recipe = load_recipe(
        "demo",
        [
            "train.data.prompts_per_rollout=8",
            "train.sampling.guidance_scale=1.5",
            "train.data.shuffle=false",
            "train.sampling.negative_prompt=blurry, low quality",
            "train.data.data_path=/x/prompts.json",
            "train.data.source=file",
        ],
    )
    assert recipe.train.data.prompts_per_rollout == 8
    assert recipe.train.sampling.guidance_scale == 1.5
    assert recipe.train.data.shuffle is False
    assert recipe.train.sampling.negative_prompt == "blurry, low quality"
    assert recipe.train.data.data_path == "/x/prompts.json"
    assert load_recipe("demo", ["train.output_dir=/elsewhere"]).train.output_dir == "/elsewhere"


def test_every_error_is_reported_with_value_and_what_is_allowed():
    with pytest.raises(RecipeError) as info:
        load_recipe(
            "demo",
            [
                "train.sampling.height=500",
                "train.data.prompts_per_rollout=0",
                "train.sampling.seed=abc",
                "train.data.prompt_per_rollout=3",
            ],
        )
    found = issues_of(info.value)
    assert found["train.sampling.height"] == "train.sampling.height: got '500'; Input should be a multiple of 8"
    assert "got '0'; Input should be greater than 0" in found["train.data.prompts_per_rollout"]
    assert "valid integer" in found["train.sampling.seed"]
    assert "unknown key" in found["train.data.prompt_per_rollout"]
    assert len(found) == 4


def test_cross_field_checks_point_at_the_field():
    with pytest.raises(RecipeError) as info:
        recipe_from_tree({"train": {"data": {"source": "file"}}})
    assert "the `file` source needs one" in issues_of(info.value)["train.data.data_path"]
    with pytest.raises(RecipeError) as info:
        recipe_from_tree({"train": {"data": {"source": "bogus"}}})
    assert (
        "a registered source (file, smoke, arithmetic, counting) or an importable dotted class path"
        in issues_of(info.value)["train.data.source"]
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("train.data", "an override is dotted.key=value"),
        ("train..x=1", "an override is dotted.key=value"),
        ("name.sub=1", "name is a value, not a section"),
    ],
)
def test_malformed_overrides(override, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe("demo", [override])


def test_unknown_recipe_lists_the_packaged_ones_and_suggests_the_closest():
    with pytest.raises(RecipeError, match=r"no packaged recipe of that name; did you mean 'demo'\? packaged: \['demo'"):
        load_recipe("dmeo")
    with pytest.raises(RecipeError, match=r"did you mean 'sd35_medium_grpo'\?"):
        load_recipe("sd35_medum_grpo")
    with pytest.raises(RecipeError, match=r"of that name; packaged: \['demo'"):  # nothing close: no guess
        load_recipe("zzzzzz")


def test_non_mapping_and_invalid_yaml(tmp_path):
    (tmp_path / "a.yaml").write_text("- train\n")
    with pytest.raises(RecipeError, match="a recipe is a YAML mapping"):
        load_recipe(str(tmp_path / "a.yaml"))
    (tmp_path / "b.yaml").write_text("train: [\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(str(tmp_path / "b.yaml"))


def _fields_without_description(schema: dict) -> list[str]:
    missing = []
    for name, definition in {"Recipe": schema, **schema.get("$defs", {})}.items():
        for field, spec in definition.get("properties", {}).items():
            if not spec.get("description"):
                missing.append(f"{name}.{field}")
    return missing


def test_every_field_is_documented():
    schema = Recipe.model_json_schema()
    assert _fields_without_description(schema) == []
    assert "Global" in schema["$defs"]["DataConfig"]["properties"]["prompts_per_rollout"]["description"]


def test_an_override_replaces_a_value_whose_variable_is_unset():
    recipe = load_recipe("prompts_file", ["train.data.data_path=/x/prompts.json"], env={})
    assert recipe.train.data.data_path == "/x/prompts.json"


def test_interpolation_edge_cases():
    tree = {"train": {"data": {"source": "smoke", "prompt_key": "$${env:HOME}"}, "output_dir": "${env:A,${env:B}}"}}
    with pytest.raises(RecipeError) as info:
        recipe_from_tree(tree, env={"B": "b"})
    assert "unresolved `${...}`" in issues_of(info.value)["train.output_dir"]
    tree["train"]["output_dir"] = "/runs/${env:RUN,default}/x"
    recipe = recipe_from_tree(tree, env={"HOME": "/root"})
    assert recipe.train.data.prompt_key == "${env:HOME}"  # `$${` escapes
    assert recipe.train.output_dir == "/runs/default/x"


def test_duplicate_yaml_keys_are_refused(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  data:\n    source: smoke\n  data:\n    source: file\n")
    with pytest.raises(RecipeError, match="duplicate key 'data'"):
        load_recipe(str(path))


@pytest.mark.parametrize(
    ("override", "path", "message"),
    [
        ("train.data.seed=-5", "train.data.seed", "greater than or equal to 0"),
        ("train.sampling.seed=-1", "train.sampling.seed", "greater than or equal to 0"),
        ("train.sampling.guidance_scale=inf", "train.sampling.guidance_scale", "finite number"),
        ("train.data.prompts_per_rollout=2.5", "train.data.prompts_per_rollout", "valid integer"),
        ("train.data.source=os.path", "train.data.source", "is not a class with next_batch()"),
        ("train.data.source=flows.cli.app", "train.data.source", "is not a class with next_batch()"),
        ("train.data.source=nowhere.Source", "train.data.source", "importing it failed"),
        ("precache.foo=1", "precache.foo", "unknown key"),
    ],
)
def test_values_that_would_fail_later_fail_at_validation(override, path, message):
    with pytest.raises(RecipeError) as info:
        load_recipe("demo", [override])
    assert message in issues_of(info.value)[path]


def test_yaml_booleans_are_not_counts():
    with pytest.raises(RecipeError) as info:
        recipe_from_tree({"train": {"data": {"source": "smoke", "prompts_per_rollout": True}}})
    assert "not true/false" in issues_of(info.value)["train.data.prompts_per_rollout"]
