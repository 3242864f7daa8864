"""BAGEL data end to end: exports from ingested shards load back as a mixture and pack; packed batches through a
real torch DataLoader with 2 workers resume exactly from their `data_status`; `unirl bagel pack-stats` prints its
table and `unirl bagel export` writes loadable data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from bagel_cases import write_ingested
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.data.bagel.batch_check import validate_batch
from unirl_core.data.bagel.config import load_mixture
from unirl_core.data.bagel.datasets import Layout
from unirl_core.data.bagel.demo import VAE_ARGS, VIT_ARGS, write_demo_mixture
from unirl_core.data.bagel.export import export_t2i, export_vlm
from unirl_core.data.bagel.loader import PackedDataset, open_packer, packing_config

runner = CliRunner()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return write_demo_mixture(tmp_path_factory.mktemp("bagel-loader"))


@pytest.fixture(scope="module")
def ingested(tmp_path_factory) -> str:
    """An ingested dataset root as `unirl ingest` leaves it: 10 captioned images in shards of 4."""
    return write_ingested(tmp_path_factory.mktemp("ingested") / "ds")


def test_exports_load_back_as_a_mixture_and_pack(ingested, demo, tmp_path):
    t2i = export_t2i(ingested, str(tmp_path / "t2i"), rows_per_file=4, rows_per_row_group=2)
    vlm = export_vlm(ingested, str(tmp_path / "vlm"))
    groups = yaml.safe_load((tmp_path / "t2i" / "bagel_data.yaml").read_text())  # the exports' own groups
    groups |= yaml.safe_load((tmp_path / "vlm" / "bagel_data.yaml").read_text())
    assert groups["t2i_pretrain"]["dataset_names"] == [t2i["dataset_name"]] and groups["vlm_sft"]["num_used_data"] == [
        10
    ]
    groups["t2i_pretrain"]["image_transform_args"] = VAE_ARGS  # tiny images for a tiny pack
    groups["vlm_sft"]["image_transform_args"] = VIT_ARGS
    config = {
        **groups,
        "dataset_info": {"t2i_pretrain": {t2i["dataset_name"]: t2i["dataset_info"]},
                         "vlm_sft": {vlm["dataset_name"]: vlm["dataset_info"]}},
        "tokenizer": str(demo.parent / "tokenizer"),
        "packing": {"expected_num_tokens": 1024, "max_num_tokens": 1280, "max_num_tokens_per_sample": 600,
                    "prefer_buffer_before": 512},
    }  # fmt: skip
    path = tmp_path / "mixture.yaml"
    path.write_text(yaml.safe_dump(config))
    mixture = load_mixture(path)
    packer = open_packer(mixture, Layout(rank=1, world_size=3, num_workers=1))  # 3 parquet files: one per rank
    seen = set()
    for _ in range(4):
        batch = next(packer)
        validate_batch(batch, packing_config(mixture))
        seen |= {(d["dataset_name"], json.dumps(d["data_indexes"])) for d in batch["batch_data_indexes"]}
        assert {d["dataset_name"] for d in batch["batch_data_indexes"]} >= {"t2i_pretrain"}  # mandatory in every pack
    assert {name for name, _ in seen} == {"t2i_pretrain", "vlm_sft"}
    assert t2i["samples"] == vlm["samples"] == 10


def _batches(dataset: PackedDataset) -> list[dict]:
    # A bounded dataset (packs_per_worker): the workers end on their own, none is stopped mid-pack. Forkserver, not
    # fork: in this pytest process Prefect flows have run, and a plain fork of such a process exits with code 1
    # (Prefect 3.8's at-exit queue drain asserts in the child), which the DataLoader reports as a dead worker.
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="forkserver")
    return list(loader)


def test_dataloader_workers_resume_exactly_from_data_status(demo):
    mixture = load_mixture(demo)
    mixture.packing = {**mixture.packing, "expected_num_tokens": 1536, "max_num_tokens": 1792,
                       "max_num_tokens_per_sample": 1024, "prefer_buffer_before": 768}  # fmt: skip
    layout = Layout(rank=0, world_size=1, num_workers=2, seed=0)
    straight = _batches(PackedDataset(mixture, layout, packs_per_worker=4))
    assert [b["worker_id"] for b in straight] == [0, 1] * 4  # 4 packs per worker, then the loader ends
    with pytest.raises(ValueError, match="packs_per_worker"):
        PackedDataset(mixture, layout, packs_per_worker=0)
    status = {b["worker_id"]: b["data_status"] for b in straight[:4]}  # as a trainer's checkpoint would keep them
    resumed = _batches(PackedDataset(mixture, layout, json.loads(json.dumps(status)), packs_per_worker=2))
    for expected, got in zip(straight[4:], resumed, strict=True):
        assert got["batch_data_indexes"] == expected["batch_data_indexes"]
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, got[key]), key
        assert all(torch.equal(a, b) for a, b in zip(expected["nested_attention_masks"],
                                                     got["nested_attention_masks"], strict=True))  # fmt: skip
    files = {json.dumps(d["data_indexes"]) for b in straight if b["worker_id"] == 0 for d in b["batch_data_indexes"]
             if d["dataset_name"] == "t2i_pretrain"}  # fmt: skip
    assert all(json.loads(f)[0] in (0, 1) for f in files)  # worker 0 reads its own 2 of the 4 t2i files


def test_pack_stats_cli_prints_the_table(tmp_path):
    env = {"UNIRL_HOME": str(tmp_path / "home")}
    result = runner.invoke(app, ["bagel", "pack-stats", "demo", "--packs", "8"], env=env)
    assert result.exit_code == 0, result.output
    for text in ("packed for", "bagel (BAGEL's trainer)", "tokens per pack", "fill ratio vs target",
                 "samples per pack by dataset", "t2i_pretrain", "unified_edit", "vlm_sft", "bad_image"):  # fmt: skip
        assert text in result.output, text
    result = runner.invoke(app, ["bagel", "pack-stats", "demo", "--packs", "4", "--json"], env=env)
    stats = json.loads(result.stdout)
    assert stats["packs"] == 4 and stats["target"] == 4096 and stats["fill_ratio"] >= 1.0
    assert stats["packed_for"] == "bagel"
    ours = runner.invoke(app, ["bagel", "pack-stats", "demo", "--packs", "1", "--json", "--target", "unirl"], env=env)
    assert json.loads(ours.stdout)["packed_for"] == "unirl"
    assert set(stats["samples_per_pack"]) == {"t2i_pretrain", "unified_edit", "vlm_sft"}
    bad = runner.invoke(app, ["bagel", "pack-stats", str(tmp_path / "nope.yaml")], env=env)
    assert bad.exit_code == 2 and "nope.yaml" in bad.stderr


def test_export_cli_writes_loadable_parquet(ingested, tmp_path):
    result = runner.invoke(app, ["bagel", "export", "t2i", ingested, str(tmp_path / "out"), "--rows-per-file", "5"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["samples"] == 10 and summary["dataset_info"]["num_files"] == 2
    info = json.loads(Path(summary["dataset_info"]["data_dir"], "parquet_info.json").read_text())
    assert sorted(info) == sorted(str(p) for p in (tmp_path / "out").resolve().glob("*.parquet"))
