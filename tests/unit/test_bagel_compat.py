"""What BAGEL's own code accepts, checked without BAGEL: its `PackedDataset.build_datasets` (data/dataset_base.py)
turned into kwargs for its dataset constructors, whose parameter lists are written down here as facts (read at
ByteDance-Seed/Bagel data/t2i_dataset.py, data/interleave_datasets/interleave_t2i_dataset.py, data/vlm_dataset.py).
The exports' `bagel_data.yaml` groups and `dataset_info.json` entries, and the demo mixture, construct as written;
the entries the issue found refused (t2i `parquet_info_path`, no `num_used_data`) are refused by the same check, and
by our own config under `target: bagel` before any data is read."""

from __future__ import annotations

import json
import os

import image_cases as cases
import pytest
import yaml
from bagel_cases import write_ingested

from unirl_core.data.bagel.config import Mixture, load_mixture
from unirl_core.data.bagel.demo import write_demo_mixture
from unirl_core.data.bagel.export import export_edit, export_t2i, export_vlm

COMMON = ("local_rank", "world_size", "num_workers", "data_status")  # every constructor: keyword, with defaults
CONSTRUCTORS = {  # dataset type -> (required parameters, optional parameters)
    "t2i_pretrain": (("dataset_name", "transform", "tokenizer", "data_dir_list", "num_used_data"), COMMON),
    "unified_edit": (("dataset_name", "transform", "tokenizer", "vit_transform", "data_dir_list", "num_used_data",
                      "parquet_info"), COMMON),
    "vlm_sft": (("dataset_name", "transform", "tokenizer", "frame_sampler", "jsonl_path_list", "data_dir_list",
                 "num_used_data"), (*COMMON, "shuffle_lines", "shuffle_seed")),
}  # fmt: skip


def bagel_constructs(kind: str, group: dict, dataset_info: dict) -> None:
    """build_datasets' steps for one group, then the constructor call's argument check (TypeError as Python's)."""
    args = dict(group)
    args.pop("is_mandatory", None), args.pop("weight", None), args.pop("resume_data_status", None)
    for key, name in (("frame_sampler_args", "frame_sampler"), ("image_transform_args", "transform"),
                      ("vit_image_transform_args", "vit_transform")):  # fmt: skip
        if key in args:
            args[name] = args.pop(key)
    args["data_dir_list"] = []
    for item in args.pop("dataset_names"):
        meta = dataset_info[kind].get(item, {})
        if "data_dir" in meta:
            args["data_dir_list"].append(meta["data_dir"])
        if "parquet_info_path" in meta:
            with open(meta["parquet_info_path"]) as handle:
                args.setdefault("parquet_info", {}).update(json.load(handle))
        if "json_dir" in meta:
            args.setdefault("json_dir_list", []).append(meta["json_dir"])
        if "jsonl_path" in meta:
            args.setdefault("jsonl_path_list", []).append(meta["jsonl_path"])
    args |= {"dataset_name": kind, "tokenizer": object(), "local_rank": 0, "world_size": 1, "num_workers": 1,
             "data_status": None}  # fmt: skip
    required, optional = CONSTRUCTORS[kind]
    unexpected = sorted(set(args) - set(required) - set(optional))
    if unexpected:
        raise TypeError(f"__init__() got an unexpected keyword argument {unexpected[0]!r}")
    missing = [name for name in required if name not in args]
    if missing:
        raise TypeError(f"__init__() missing {len(missing)} required positional argument: {missing[0]!r}")
    if kind == "unified_edit":  # its get_data_paths: every listed parquet is looked up by os.path.join(data_dir, name)
        for data_dir in args["data_dir_list"]:
            names = sorted(n for n in os.listdir(data_dir) if n.endswith(".parquet"))
            assert all(os.path.join(data_dir, n) in args["parquet_info"] for n in names)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("compat")
    ingested = write_ingested(root / "ds")
    (root / "pics").mkdir()
    for i in range(3):
        (root / "pics" / f"{i}.png").write_bytes(cases.encode(cases.procedural(16, 16, seed=i), "PNG"))
    line = {"images": ["pics/0.png", "pics/1.png", "pics/2.png"], "instructions": [["red"], ["blue"]]}
    (root / "edit.jsonl").write_text(json.dumps(line) + "\n")
    return {
        "t2i": export_t2i(ingested, str(root / "t2i"), rows_per_file=4, rows_per_row_group=2),
        "t2i_unirl": export_t2i(
            ingested, str(root / "t2i_unirl"), rows_per_file=4, rows_per_row_group=2, target="unirl"
        ),
        "edit": export_edit(str(root / "edit.jsonl"), str(root / "edit"), dataset_name="my_edits"),
        "vlm": export_vlm(ingested, str(root / "vlm")),
    }


def as_written(summary: dict) -> tuple[str, dict, dict]:
    """(type, group, dataset_info) from the export's files: bagel_data.yaml and dataset_info.json."""
    with open(summary["bagel_data"]) as handle:
        ((kind, group),) = yaml.safe_load(handle).items()
    with open(os.path.join(summary["out_dir"], "dataset_info.json")) as handle:
        entry = json.load(handle)
    return kind, group, {kind: {group["dataset_names"][0]: entry}}


@pytest.mark.parametrize("name", ["t2i", "edit", "vlm"])
def test_exports_construct_bagels_datasets_as_written(exports, name):
    kind, group, info = as_written(exports[name])
    bagel_constructs(kind, group, info)
    assert group["num_used_data"] == [exports[name]["dataset_info"].get("num_files", exports[name]["samples"])]
    Mixture(groups={kind: group}, dataset_info=info)  # and our own config under target bagel takes them too


def test_edit_group_is_named_as_asked_and_t2i_after_its_folder(exports):
    assert as_written(exports["edit"])[1]["dataset_names"] == ["my_edits"]
    parent = os.path.basename(os.path.dirname(exports["t2i"]["out_dir"]))  # a folder named after the kind: its parent's
    assert as_written(exports["t2i"])[1]["dataset_names"] == [parent.replace("-", "_")]


def test_groups_bagel_would_refuse_for_keys_or_transforms_are_refused(exports):
    kind, group, info = as_written(exports["t2i"])
    with pytest.raises(ValueError, match="T2IIterableDataset takes no `shuffle_lines`"):
        Mixture(groups={kind: group | {"shuffle_lines": True}}, dataset_info=info)
    with pytest.raises(ValueError, match="requires `image_transform_args`"):
        Mixture(groups={kind: {k: v for k, v in group.items() if k != "image_transform_args"}}, dataset_info=info)
    kind, group, info = as_written(exports["edit"])
    with pytest.raises(ValueError, match="requires `vit_image_transform_args`"):
        Mixture(groups={kind: {k: v for k, v in group.items() if k != "vit_image_transform_args"}}, dataset_info=info)
    with pytest.raises(ValueError, match="set `target:` at the top level"):
        Mixture(groups={kind: group}, dataset_info=info, packing={"target": "unirl"})


def test_what_bagel_refuses_is_refused_by_the_check_and_by_our_config(exports):
    kind, group, info = as_written(exports["t2i_unirl"])  # target unirl: the entry names parquet_info_path
    with pytest.raises(TypeError, match="unexpected keyword argument 'parquet_info'"):
        bagel_constructs(kind, group, info)
    with pytest.raises(ValueError, match="T2IIterableDataset takes no `parquet_info`"):
        Mixture(groups={kind: group}, dataset_info=info)
    Mixture(groups={kind: group}, dataset_info=info, target="unirl")
    kind, group, info = as_written(exports["t2i"])
    without = {k: v for k, v in group.items() if k != "num_used_data"}
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'num_used_data'"):
        bagel_constructs(kind, without, info)
    with pytest.raises(ValueError, match="require `num_used_data`"):
        Mixture(groups={kind: without}, dataset_info=info)
    kind, group, info = as_written(exports["vlm"])
    without = {k: v for k, v in group.items() if k != "frame_sampler_args"}
    with pytest.raises(TypeError, match="'frame_sampler'"):
        bagel_constructs(kind, without, info)
    with pytest.raises(ValueError, match="frame_sampler_args"):
        Mixture(groups={kind: without}, dataset_info=info)


def test_the_demo_mixture_constructs_bagels_datasets(tmp_path):
    path = write_demo_mixture(tmp_path)
    tree = yaml.safe_load(path.read_text())
    mixture = load_mixture(path)  # paths resolved against the YAML's folder, as BAGEL's dataset_info.py holds them
    info = {kind: {name: entry.model_dump(exclude_none=True) for name, entry in entries.items()}
            for kind, entries in mixture.dataset_info.items()}  # fmt: skip
    for kind in ("t2i_pretrain", "unified_edit", "vlm_sft"):
        bagel_constructs(kind, tree[kind], info)
    assert mixture.target == "bagel" and mixture.seed == 0  # the demo sets its seed; BAGEL's default is 42
    del tree["seed"]
    path.write_text(yaml.safe_dump(tree))
    assert load_mixture(path).seed == 42 and load_mixture(path, target="unirl").seed == 0
