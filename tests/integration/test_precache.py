"""The precache flow on ingested shards with tiny real encoders (VAE, T5), on real Prefect, local and S3."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import image_cases as cases
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unirl_core.config.ingest import IngestConfig
from unirl_core.config.precache import PrecacheConfig
from unirl_core.io.tars import TarShardWriter, iter_samples
from unirl_core.precache.read import check_cache, read_encodings
from unirl_core.precache.run import PrecacheError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Ingested shards (8 + 8 + 7 samples) plus a hand-made shard whose second sample has a corrupt image."""
    from unirl_core.ingest import stages
    from unirl_core.models.registry import write_tiny_model

    folder = tmp_path_factory.mktemp("precache-source")
    rows = [
        {"image": cases.jpeg(64 + i, 48, seed=i), "caption": f"a photo number {i}" + " and more" * (i % 4)}
        for i in range(23)
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "in.parquet")
    config = IngestConfig.model_validate(
        {
            "dataset_output_root": str(folder / "ds"),
            "download_parquet": {"parquet_pattern": str(folder / "in.parquet"), "rows_per_unit": 12},
            "download_images": {
                "url_col": None,
                "image_bytes_col": "image",
                "resize_mode": "center_crop",
                "image_size": 40,
            },
            "reorganize_tar": {"tar_chunk_size": 8},
        }
    )
    units = stages.stage_download_parquet(config)
    for unit in units:
        stages.download_unit(config.dataset_output_root, unit, config)
    stages.stage_generate_wdinfo(config, stages.stage_reorganize_tar(config, units))
    with TarShardWriter(str(folder / "ds" / "shards" / "00009.tar")) as writer:
        writer.write("900000000", {"jpg": cases.jpeg(50, 40, seed=90), "txt": b"good extra", "json": b"{}"})
        writer.write("900000001", {"jpg": cases.truncated_jpeg(), "txt": b"corrupt image", "json": b"{}"})
        writer.commit()
    model = write_tiny_model(folder / "sd3", "sd3")
    return {"shards": str(folder / "ds" / "shards"), "model": str(model), "folder": folder}


def precache_config(source, output: str, **values) -> PrecacheConfig:
    return PrecacheConfig.model_validate(
        {
            "input_dir": source["shards"],
            "output_dir": output,
            "batch_size_per_GPU": 4,
            "dataloader_num_workers": 2,
            "tar_chunk_size": 5,
            "node_array_size": 2,
            "save_original_in_tar": ["text"],
            "image_transform": {"size": 32},
            "encodings": [
                {"modality": "image", "extension": "jpg", "key": "autoencoderkl_image", "precision": 16,
                 "encoder_config": {"cls": "unirl_core.precache.encoders.AutoencoderKLEncoder", "pretrained": source["model"]}},
                {"modality": "text", "extension": "txt", "key": "t5_text", "precision": 32, "store_pad_tokens": False,
                 "encoder_config": {"cls": "unirl_core.precache.encoders.T5TextEncoder", "pretrained": source["model"], "max_length": 48}},
            ],
            **values,
        }
    )  # fmt: skip


def source_keys(source) -> list[str]:
    return [f"{p.name}/{key}" for p in sorted(Path(source["shards"]).glob("*.tar")) for key, _ in iter_samples(str(p))]


def test_precache_safe_format_key_parity_and_index(prefect_harness, source, tmp_path):
    from flows.precache import precache
    from unirl_core.summaries import PrecacheSummary

    config = precache_config(source, str(tmp_path / "out"))
    summary = precache(config)
    assert isinstance(summary, PrecacheSummary)
    assert summary.tasks == 2 and summary.source_samples == 25 and summary.samples == 24 and summary.skipped == 1

    samples = list(read_encodings(config.output_dir, config))
    skipped = [s for d in check_cache(config.output_dir, config) for s in d["skipped"]]
    assert [s["key"] for s in skipped] == ["00009.tar/900000001"] and "jpg" in skipped[0]["reason"]
    assert sorted(s["key"] for s in samples) == sorted(set(source_keys(source)) - {"00009.tar/900000001"})
    first = samples[0]
    assert first["encodings"]["autoencoderkl_image"].shape == (8, 16, 16)  # mean + logvar, 32 px / 2
    assert str(first["encodings"]["autoencoderkl_image"].dtype) == "torch.float16"
    lengths = {s["encodings"]["t5_text"].shape[0] for s in samples}
    assert len(lengths) > 3 and all(s["encodings"]["t5_text"].shape[1] == 64 for s in samples)  # unpadded, T5 width
    assert first["originals"]["txt"].decode().startswith("a photo number")

    out = Path(config.output_dir)
    index = json.loads((out / "index.json").read_text())
    wdinfo = pickle.loads((out / "wdinfo.pkl").read_bytes())
    assert wdinfo["chunk_size"] == 5 and wdinfo["tar_files"] == sorted(s["url"] for s in index["shardlist"])
    assert all(s["nsamples"] == 5 for s in index["shardlist"]) and index["incomplete"]
    assert sorted(p.name for p in out.glob("*.tar")) == sorted(wdinfo["tar_files"] + index["incomplete"])
    assert not list(out.glob("*.pickle")) and not any(
        "pickle" in m for _, ms in iter_samples(str(out / "t0_r0_0.tar")) for m in ms
    )

    again = precache(config)  # finished tasks are not redone
    assert again.samples == 24
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        artifacts = {a.key: a for a in client.read_latest_artifacts()}
    assert artifacts["precache-progress"].data == 100.0 and "precache-summary" in artifacts

    from typer.testing import CliRunner

    from flows.cli import app

    shown = CliRunner().invoke(app, ["shards", "inspect", config.output_dir, "--samples", "2"])
    assert shown.exit_code == 0, shown.output
    head, record, _ = [json.loads(line) for line in shown.stdout.splitlines()]
    assert head["rows"] == 25 and head["skip_reasons"] == {"jpg": 1} and head["samples"] == 20
    assert record["encodings"]["autoencoderkl_image"] == {"shape": [8, 16, 16], "dtype": "float16"}
    assert record["encodings"]["t5_text"]["dtype"] == "float32"


def test_npy_and_nemo_pickle_formats(prefect_harness, source, tmp_path):
    import webdataset as wds

    from flows.precache import precache

    npy = precache_config(source, str(tmp_path / "npy"), pickle_encodings=False, node_array_size=1)
    precache(npy)
    key, members = next(iter_samples(str(tmp_path / "npy" / "t0_r0_0.tar")))
    assert set(members) == {"autoencoderkl_image", "t5_text", "txt"}
    assert np.load(io.BytesIO(members["autoencoderkl_image"]), allow_pickle=False).dtype == np.float16

    nemo = precache_config(source, str(tmp_path / "nemo"), format="nemo_pickle", node_array_size=1)
    precache(nemo)
    with open(tmp_path / "nemo" / "wdinfo.pkl", "rb") as f:  # NeMo's loader: wdinfo, then webdataset decode
        info = pickle.load(f)
    urls = [str(tmp_path / "nemo" / name) for name in info["tar_files"]]
    sample = next(iter(wds.WebDataset(urls, shardshuffle=False).decode()))
    assert sample["__key__"] == "00000.tar/000000000"
    assert (
        set(sample["pickle"]) == {"autoencoderkl_image", "t5_text"} and sample["pickle"]["t5_text"].dtype == np.float32
    )
    with pytest.raises(
        PrecacheError, match=r"t0_r0_0.tar: member '00000.tar/000000000.pickle' refused: .*precache.trusted: true"
    ):
        next(read_encodings(nemo.output_dir, nemo))
    assert next(read_encodings(nemo.output_dir, nemo, trusted=True))["encodings"]["t5_text"].shape[1] == 64
    trusting = precache_config(source, str(tmp_path / "nemo"), format="nemo_pickle", node_array_size=1, trusted=True)
    assert next(read_encodings(trusting.output_dir, trusting))["encodings"]["t5_text"].shape[1] == 64


def test_merge_source_tar_adds_source_members(prefect_harness, source, tmp_path):
    from flows.precache import precache

    config = precache_config(
        source, str(tmp_path / "merged"), node_array_size=1, merge_source_extensions=["json", "jpg"]
    )
    precache(config)
    sources = {
        k: m
        for p in sorted(Path(source["shards"]).glob("*.tar"))
        for k, m in ((f"{p.name}/{k}", m) for k, m in iter_samples(str(p)))
    }
    samples = list(read_encodings(config.output_dir, config))
    assert len(samples) == 24
    for sample in samples:
        assert sample["originals"]["jpg"] == sources[sample["key"]]["jpg"]
        assert sample["originals"]["json"] == sources[sample["key"]]["json"]
    index = json.loads((tmp_path / "merged" / "index.json").read_text())
    import hashlib

    first = index["shardlist"][0]
    assert hashlib.sha256((tmp_path / "merged" / first["url"]).read_bytes()).hexdigest() == first["sha256"]
    before = (tmp_path / "merged" / first["url"]).read_bytes()
    precache(config)  # merged already: a no-op
    assert (tmp_path / "merged" / first["url"]).read_bytes() == before


def test_stale_cache_is_refused(prefect_harness, source, tmp_path):
    from flows.precache import precache

    config = precache_config(source, str(tmp_path / "out"), node_array_size=1)
    precache(config)
    changed = precache_config(source, str(tmp_path / "out"), node_array_size=1, image_transform={"size": 16})
    with pytest.raises(PrecacheError, match="cache built with .* config wants"):
        check_cache(changed.output_dir, changed)
    with pytest.raises(PrecacheError, match="cache built with"):
        precache(changed)
    other_weights = precache_config(source, str(tmp_path / "out"), node_array_size=1)
    other_weights.encodings[0].encoder_config.latent = "mean"  # a different encoder setting
    with pytest.raises(PrecacheError, match="cache built with"):
        check_cache(other_weights.output_dir, other_weights)


def test_precache_over_s3(prefect_harness, source, s3_endpoint):
    import fsspec

    from flows.precache import precache

    fs = fsspec.filesystem("s3")
    for path in sorted(Path(source["shards"]).glob("0000[01].tar")):
        fs.put_file(str(path), f"unirl-test/pc-src/{path.name}")
    config = precache_config(source, "s3://unirl-test/pc-out", input_dir="s3://unirl-test/pc-src", node_array_size=1)
    summary = precache(config)
    assert summary.samples == 16 and summary.shards == 3
    assert len(list(read_encodings(config.output_dir, config))) == 16
    assert fs.exists("unirl-test/pc-out/index.json") and fs.exists("unirl-test/pc-out/wdinfo.pkl")
