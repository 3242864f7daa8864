"""A BAGEL mixture whose data lives in S3 (moto's server over real HTTP): parquet listing and row groups, the edit
parquet_info keyed by s3:// URLs, the vlm_sft JSONL read once and its images fetched, packed and resumed."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest
import yaml

from unirl_core.data.bagel.batch_check import validate_batch
from unirl_core.data.bagel.config import load_mixture
from unirl_core.data.bagel.datasets import Layout
from unirl_core.data.bagel.demo import write_demo_mixture
from unirl_core.data.bagel.loader import open_groups, open_packer, packing_config

pytestmark = pytest.mark.slow


def test_a_mixture_in_s3_packs_like_the_local_one_and_resumes(s3_endpoint, tmp_path):
    local = write_demo_mixture(tmp_path / "local")
    root = local.parent
    fs = fsspec.filesystem("s3")
    fs.put(str(root / "t2i"), "unirl-test/bagel/t2i", recursive=True)
    fs.put(str(root / "edit"), "unirl-test/bagel/edit", recursive=True)
    fs.put(str(root / "vlm"), "unirl-test/bagel/vlm", recursive=True)
    for kind in ("t2i", "edit"):  # parquet_info keys are the real paths: in S3, the s3:// URLs
        info = json.loads((root / kind / "parquet_info.json").read_text())
        moved = {f"s3://unirl-test/bagel/{kind}/{Path(p).name}": v for p, v in info.items()}
        fs.pipe_file(f"unirl-test/bagel/{kind}/parquet_info.json", json.dumps(moved).encode())
    tree = yaml.safe_load(local.read_text())
    for entries in tree["dataset_info"].values():
        for entry in entries.values():
            for key in ("data_dir", "parquet_info_path", "jsonl_path"):
                if key in entry:
                    entry[key] = f"s3://unirl-test/bagel/{entry[key]}"
    tree["tokenizer"] = str(root / "tokenizer")
    remote = tmp_path / "s3-mixture.yaml"
    remote.write_text(yaml.safe_dump(tree))

    layout = Layout(rank=0, world_size=1, num_workers=1, seed=0)
    packs = {}
    for name, path in (("local", local), ("s3", remote)):
        mixture = load_mixture(path)
        packer = open_packer(mixture, layout)
        packs[name] = [next(packer) for _ in range(3)]
        for batch in packs[name]:
            validate_batch(batch, packing_config(mixture))
    indexes = [[json.dumps(b["batch_data_indexes"]) for b in packs[name]] for name in ("local", "s3")]
    assert indexes[0] == indexes[1]  # the same samples, in the same packs
    assert {d["dataset_name"] for b in packs["s3"] for d in b["batch_data_indexes"]} == {
        "t2i_pretrain", "unified_edit", "vlm_sft"}  # fmt: skip
    readers = {}  # one whole pass over the VLM lines, its video included: the same samples, the same skips
    for name, path in (("local", local), ("s3", remote)):
        datasets, _ = open_groups(load_mixture(path), layout)
        reader = datasets["vlm_sft"].reader()
        samples = [next(reader) for _ in range(len(datasets["vlm_sft"].units))]
        images = [sum(e["type"] == "vit_image" for e in s.sequence_plan) for s in samples]
        readers[name] = ([s.data_indexes for s in samples], [s.num_tokens for s in samples], images,
                         dict(reader.skipped))  # fmt: skip
    assert readers["s3"] == readers["local"]
    assert "bad_video" not in readers["s3"][3] and 8 <= max(readers["s3"][2]) <= 12  # the video's sampled frames
    mixture = load_mixture(remote)
    packer = open_packer(mixture, layout)
    next(packer)
    resumed = open_packer(mixture, layout, state=json.loads(json.dumps(packer.state())))
    assert json.dumps(next(resumed)["batch_data_indexes"]) == json.dumps(packs["s3"][1]["batch_data_indexes"])
