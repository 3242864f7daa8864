"""`unirl shards inspect` reports every sample on disk: the index's complete shards and the incomplete tail shards
(which wdinfo.pkl and index.json leave out), on real precache and ingest outputs made in well under a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from unirl_core.config.precache import PrecacheConfig
from unirl_core.ingest.reorganize import reorganize, shards_folder
from unirl_core.io.shard_index import generate_wdinfo
from unirl_core.io.tars import TarShardWriter, iter_samples
from unirl_core.precache.stages import run_task, write_index

NUM_SOURCE = 5  # source samples; a chunk size above it leaves every one in the incomplete tail


def inspect(path: Path, *args: str) -> tuple[dict, list[dict]]:
    result = CliRunner().invoke(app, ["shards", "inspect", str(path), *args])
    assert result.exit_code == 0, result.output
    head, *records = [json.loads(line) for line in result.stdout.splitlines()]
    return head, records


def source_shard(folder: Path) -> list[dict]:
    with TarShardWriter(str(folder / "00000.tar")) as writer:
        for i in range(NUM_SOURCE):
            writer.write(f"{i:09d}", {"txt": f"caption {i}".encode(), "json": b"{}"})
        info = writer.commit()
    return [{"path": str(folder / info.name), "sha256": info.sha256}]


def precache_output(tmp_path: Path, chunk_size: int) -> tuple[Path, dict]:
    """A real precache run (toy text encoder) over one source shard; returns (output folder, its done record)."""
    source = tmp_path / "src"
    source.mkdir()
    source_shard(source)
    config = PrecacheConfig.model_validate(
        {
            "input_dir": str(source),
            "output_dir": str(tmp_path / "precache"),
            "batch_size_per_GPU": 2,
            "dataloader_num_workers": 0,
            "device": "cpu",
            "tar_chunk_size": chunk_size,
            "save_original_in_tar": ["text"],
            "encodings": [{"modality": "text", "extension": "txt", "key": "toy_text", "store_pad_tokens": False,
                           "encoder_config": {"cls": "toy_encoders.SlowText", "delay_s": 0}}],
        }
    )  # fmt: skip
    done = run_task(config, 0, 1)
    write_index(config)
    return tmp_path / "precache", done


@pytest.mark.parametrize("chunk_size", [NUM_SOURCE + 3, 2])
def test_precache_output_reports_its_incomplete_tail(tmp_path, chunk_size):
    out, done = precache_output(tmp_path, chunk_size)
    head, records = inspect(out, "--samples", str(NUM_SOURCE))
    num_complete = done["samples"] // chunk_size
    tail = [s["name"] for s in done["shards"] if s["nsamples"] < chunk_size]
    assert (head["shards"], head["samples"]) == (num_complete, num_complete * chunk_size)  # the index, as before
    assert head["incomplete"] == tail and head["incomplete_shards"] == 1
    assert head["incomplete_samples"] == done["samples"] - num_complete * chunk_size > 0
    assert head["total_samples"] == done["samples"] == NUM_SOURCE
    assert head["incomplete_bytes"] == sum((out / name).stat().st_size for name in tail)
    assert f"{head['incomplete_samples']} sample(s) in 1 incomplete shard(s)" in head["note"]
    keys = [key for s in done["shards"] for key, _ in iter_samples(str(out / s["name"]))]
    assert [r["key"] for r in records] == keys  # --samples reads the tail too
    assert records[-1]["shard"] == tail[0] and records[-1]["encodings"]["toy_text"]["dtype"] == "float32"


def test_precache_output_with_no_complete_shard_shows_tail_records(tmp_path):
    out, done = precache_output(tmp_path, NUM_SOURCE + 3)
    head, records = inspect(out, "--samples", "2")
    assert head["shards"] == head["samples"] == 0 and head["total_samples"] == NUM_SOURCE
    assert [r["caption"] for r in records] == [f"caption {i}" for i in range(2)]


def test_ingest_output_counts_the_tail_shard_from_its_marker(tmp_path):
    """The ingest layout (shards/NNNNN.tar, a `.INCOMPLETE` marker beside the tail); found by the marker even when
    the index does not list it (an index written by an older version)."""
    raw = tmp_path / "ds" / "raw"
    raw.mkdir(parents=True)
    chunk_size = 2
    record = reorganize(str(tmp_path / "ds"), source_shard(raw), chunk_size, ["txt"])
    folder = shards_folder(str(tmp_path / "ds"))
    index = generate_wdinfo(folder, record)
    (Path(folder) / "index.json").write_text(json.dumps(index | {"incomplete": []}))
    head, records = inspect(tmp_path / "ds", "--samples", str(NUM_SOURCE))
    assert head["shards"] == NUM_SOURCE // chunk_size and head["incomplete_shards"] == 1
    assert head["incomplete_samples"] == NUM_SOURCE % chunk_size
    assert head["total_samples"] == NUM_SOURCE == len(records)


def test_complete_dataset_has_no_tail_and_no_note(tmp_path):
    raw = tmp_path / "ds" / "raw"
    raw.mkdir(parents=True)
    record = reorganize(str(tmp_path / "ds"), source_shard(raw), NUM_SOURCE, ["txt"])
    generate_wdinfo(shards_folder(str(tmp_path / "ds")), record)
    head, _ = inspect(tmp_path / "ds")
    assert head["incomplete"] == [] and head["incomplete_samples"] == 0
    assert head["total_samples"] == head["samples"] == NUM_SOURCE and "note" not in head
