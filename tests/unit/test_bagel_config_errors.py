"""A bad BAGEL data config reads like a bad recipe: `error: BAGEL data config <file>: N error(s)`, then one line per
problem naming the key as written in the YAML and the fix ("did you mean"), exit 2, no pydantic dump or URL."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.data.bagel.config import BagelConfigError, load_mixture
from unirl_core.data.bagel.demo import write_demo_mixture


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    """The demo mixture's YAML as a tree (its data folders are written beside it, so it packs as it is)."""
    path = write_demo_mixture(tmp_path_factory.mktemp("bagel-demo"))
    return {"path": path, "tree": yaml.safe_load(path.read_text())}


def broken(demo, edit) -> Path:
    """The demo mixture after `edit(tree)`, written beside the demo's (its relative data paths still resolve)."""
    tree = yaml.safe_load(yaml.safe_dump(demo["tree"]))
    edit(tree)
    path = demo["path"].with_name(f"broken-{len(list(demo['path'].parent.glob('broken-*')))}.yaml")
    path.write_text(yaml.safe_dump(tree))
    return path


def pack_stats(path: Path):
    return CliRunner().invoke(app, ["bagel", "pack-stats", str(path), "--packs", "1"])


def problem_lines(result) -> list[str]:
    """The problem lines of a refused config, after checking the header and that nothing else is printed."""
    assert result.exit_code == 2, result.output
    header, *lines = result.stderr.splitlines()
    assert header.startswith("error: BAGEL data config ") and header.endswith(f": {len(lines)} error(s)")
    for text in ("pydantic", "https://", "validation error", "Traceback", "type=", "input_value", "Value error"):
        assert text not in result.output
    assert result.stdout == ""
    return [line.strip() for line in lines]


def set_key(*path, value):
    def edit(tree):
        node = tree
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return edit


def rename_key(*path, to):
    def edit(tree):
        node = tree
        for part in path[:-1]:
            node = node[part]
        node[to] = node.pop(path[-1])

    return edit


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (rename_key("t2i_pretrain", "weight", to="weigth"), "t2i_pretrain.weigth: got 2; unknown key; did you mean 'weight'?"),
        (rename_key("tokenizer", to="tokenzier"), "tokenzier: got 'tokenizer'; unknown key; did you mean 'tokenizer'?"),
        (rename_key("t2i_pretrain", to="t2i_pretrian"), "t2i_pretrian: got {"),
        (rename_key("dataset_info", "t2i_pretrain", "demo_t2i", "num_files", to="num_filez"),
         "dataset_info.t2i_pretrain.demo_t2i.num_filez: got 4; unknown key; did you mean 'num_files'?"),
        (rename_key("packing", "max_buffer_size", to="max_bufer_size"),
         "packing.max_bufer_size: got 50; unknown key; did you mean 'max_buffer_size'?"),
        (set_key("packing", "expected_num_tokens", value="lots"),
         "packing.expected_num_tokens: got 'lots'; Input should be a valid integer"),
        (set_key("seed", value="abc"), "seed: got 'abc'; Input should be a valid integer"),
        (set_key("target", value="bagle"), "target: got 'bagle'; Input should be 'bagel' or 'unirl'"),
        (set_key("unified_edit", "weight", value=-1), "unified_edit.weight: got -1; Input should be greater than"),
        (set_key("dataset_info", value=[1, 2]), "dataset_info: got [1, 2]; Input should be a valid dictionary"),
        (set_key("vlm_sft", "num_used_data", value=[1, 2]),
         "vlm_sft: num_used_data has 2 entries for 1 dataset_names: give one count per dataset name"),
        (set_key("t2i_pretrain", "dataset_names", value=["nope"]),
         "t2i_pretrain: dataset_names ['nope'] have no entry in dataset_info[t2i_pretrain]"),
    ],
)  # fmt: skip
def test_one_clear_line_per_problem_through_the_cli(demo, edit, expected):
    lines = problem_lines(pack_stats(broken(demo, edit)))
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_every_problem_is_listed_with_its_key_as_written(demo):
    def edit(tree):
        rename_key("t2i_pretrain", "weight", to="weigth")(tree)
        transform = {**tree["t2i_pretrain"]["image_transform_args"], "image_stride": "sixteen"}  # not the shared one
        set_key("t2i_pretrain", "image_transform_args", value=transform)(tree)
        set_key("seed", value="abc")(tree)

    lines = problem_lines(pack_stats(broken(demo, edit)))
    keys = sorted(line.split(":", 1)[0] for line in lines)
    assert keys == ["seed", "t2i_pretrain.image_transform_args.image_stride", "t2i_pretrain.weigth"]
    assert "allowed here: dataset_names, image_transform_args" in next(line for line in lines if "weigth" in line)


def test_the_error_carries_the_issues_for_callers(demo):
    path = broken(demo, set_key("packing", "max_latent_size", value="big"))
    with pytest.raises(BagelConfigError) as info:
        load_mixture(path)
    assert [issue.path for issue in info.value.issues] == ["packing.max_latent_size"]
    assert isinstance(info.value, ValueError)  # callers catching ValueError still catch it


def test_a_good_mixture_still_packs(demo):
    result = CliRunner().invoke(app, ["bagel", "pack-stats", str(demo["path"]), "--packs", "1", "--json"])
    assert result.exit_code == 0, result.output
