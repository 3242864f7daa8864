"""BAGEL exports (t2i_pretrain, unified_edit, vlm_sft) from shards written as the ingest stage writes them, loaded
back with pyarrow and json: exact rows, original bytes, parquet_info that BAGEL's lookup accepts, exact skip counts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import image_cases as cases
import pyarrow.parquet as pq
import pytest

from unirl_core.data.bagel.export import export_edit, export_t2i, export_vlm, source_shards
from unirl_core.ingest.reorganize import reorganize, shards_folder
from unirl_core.io.shard_index import generate_wdinfo
from unirl_core.io.tars import TarShardWriter

NUM_SAMPLES, CORRUPT, NO_CAPTION, NO_IMAGE, MANY_CAPTIONS = 12, 3, 5, 7, 9


def make_members(i: int) -> dict[str, bytes]:
    caption = "" if i == NO_CAPTION else f"a picture number {i}"
    meta = {"key": f"00000{i:04d}", "caption": caption}
    if i == MANY_CAPTIONS:
        meta["captions"] = {"0": caption, "2": " ", "1": "another caption"}
    members = {"txt": caption.encode(), "json": json.dumps(meta).encode()}
    if i == CORRUPT:
        members["jpg"] = cases.truncated_jpeg()
    elif i % 2 == 0:
        members["png"] = cases.encode(cases.procedural(16 + i, 12, seed=i), "PNG")
    elif i != NO_IMAGE:
        members["jpg"] = cases.jpeg(16 + i, 12, seed=i)
    return members


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> tuple[str, dict[str, dict[str, bytes]]]:
    """An ingested dataset root: one raw unit of 12 samples reorganized into shards of 7 (7 + 5), as ingest does
    with file_ext_in_tar [txt, json]; returns (root, {key: members})."""
    root = tmp_path_factory.mktemp("bagel-export") / "ds"
    samples = {f"00000{i:04d}": make_members(i) for i in range(NUM_SAMPLES)}
    with TarShardWriter(str(root / "raw" / "00000.tar")) as writer:
        for key, members in samples.items():
            writer.write(key, members)
        raw = writer.commit()
    record = reorganize(
        str(root), [{"path": str(root / "raw" / "00000.tar"), "sha256": raw.sha256}], 7, ["txt", "json"]
    )
    generate_wdinfo(shards_folder(str(root)), record)
    return str(root), samples


def image_of(members: dict[str, bytes]) -> tuple[str, bytes]:
    return next((ext, members[ext]) for ext in ("jpg", "png") if ext in members)


def exported_keys(samples, *, drop_empty_caption: bool = False) -> list[str]:
    dropped = {CORRUPT, NO_IMAGE} | ({NO_CAPTION} if drop_empty_caption else set())
    return [key for i, key in enumerate(samples) if i not in dropped]


def read_parts(out: Path) -> list[dict]:
    return [row for path in sorted(out.glob("*.parquet")) for row in pq.read_table(path).to_pylist()]


def check_parquet_info(out: Path, summary: dict) -> None:
    """parquet_info keys are BAGEL's os.path.join(data_dir, name) for every parquet in data_dir, real and existing."""
    info = json.loads((out / "dataset_info.json").read_text())
    assert info == summary["dataset_info"]
    # BAGEL's T2IIterableDataset takes no parquet_info: the entry names it for edit only (and for t2i under unirl)
    assert ("parquet_info_path" in info) == (summary["format"] == "unified_edit" or summary["target"] == "unirl")
    parquet_info = json.loads(Path(info.get("parquet_info_path", f"{info['data_dir']}/parquet_info.json")).read_text())
    data_dir = info["data_dir"]
    listed = sorted(os.path.join(data_dir, n) for n in os.listdir(data_dir) if n.endswith(".parquet"))
    assert sorted(parquet_info) == listed and info["num_files"] == len(listed)
    for path, entry in parquet_info.items():
        assert os.path.isabs(path) and path == os.path.realpath(path) and os.path.exists(path)
        assert entry["num_row_groups"] == pq.ParquetFile(path).num_row_groups


def test_t2i_rows_hold_the_original_bytes_and_a_captions_object(dataset, tmp_path):
    root, samples = dataset
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")  # parquet_info keys must be the real paths
    summary = export_t2i(root, str(tmp_path / "link"), rows_per_file=4, rows_per_row_group=2)

    rows, keys = read_parts(tmp_path / "real"), exported_keys(samples)
    assert [row["image"] for row in rows] == [image_of(samples[k])[1] for k in keys]
    captions = [json.loads(row["captions"]) for row in rows]
    assert captions == [{"0": samples[k]["txt"].decode()} if samples[k]["txt"] else {} for k in keys]
    assert summary["samples"] == summary["dataset_info"]["num_total_samples"] == len(keys) == 10
    assert summary["skipped"] == {"no_image": 1, "undecodable_image": 1}
    assert summary["without_caption"] == 1
    assert summary["dataset_info"]["data_dir"] == str(tmp_path.resolve() / "real")
    check_parquet_info(tmp_path / "real", summary)


def test_t2i_gives_several_files_of_several_row_groups(dataset, tmp_path):
    export_t2i(dataset[0], str(tmp_path), rows_per_file=4, rows_per_row_group=2)
    files = [pq.ParquetFile(p) for p in sorted(tmp_path.glob("*.parquet"))]
    assert [f.metadata.num_rows for f in files] == [4, 4, 2]
    assert [f.num_row_groups for f in files] == [2, 2, 1]
    assert [f.metadata.row_group(0).num_rows for f in files] == [2, 2, 2]


def test_t2i_extra_captions_from_the_metadata_are_deduplicated(dataset, tmp_path):
    root, samples = dataset
    export_t2i(root, str(tmp_path), caption_keys=("txt", "captions"))
    rows = dict(zip(exported_keys(samples), read_parts(tmp_path), strict=True))
    many = json.loads(rows[f"00000{MANY_CAPTIONS:04d}"]["captions"])
    assert many == {"0": f"a picture number {MANY_CAPTIONS}", "1": "another caption"}  # repeat and blank dropped


def test_rerun_rewrites_identically_and_drops_stale_parts(dataset, tmp_path):
    root = dataset[0]
    export_t2i(root, str(tmp_path / "out"), rows_per_file=2, rows_per_row_group=1)
    assert len(list((tmp_path / "out").glob("*.parquet"))) == 5
    summary = export_t2i(root, str(tmp_path / "out"), rows_per_file=4, rows_per_row_group=2)
    first = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    assert export_t2i(root, str(tmp_path / "out"), rows_per_file=4, rows_per_row_group=2) == summary
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == first
    assert sorted(first) == [
        "bagel_data.yaml", "dataset_info.json", "export_summary.json", "parquet_info.json",
        "part-00000.parquet", "part-00001.parquet", "part-00002.parquet",
    ]  # fmt: skip
    check_parquet_info(tmp_path / "out", summary)
    # the same inputs by another name (shards folder, list of tars) give the same parquet bytes
    export_t2i(source_shards(root), str(tmp_path / "again"), rows_per_file=4, rows_per_row_group=2)
    assert all((tmp_path / "again" / n).read_bytes() == first[n] for n in first if n.endswith(".parquet"))
    assert source_shards(root) == source_shards(shards_folder(root)) and len(source_shards(root)) == 2


def test_vlm_jsonl_and_images(dataset, tmp_path):
    root, samples = dataset
    summary = export_vlm(root, str(tmp_path), prompt="What is shown?")
    lines = [json.loads(line) for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    keys = exported_keys(samples, drop_empty_caption=True)
    assert len(lines) == len(keys) == 9
    for line, key in zip(lines, keys, strict=True):
        ext, data = image_of(samples[key])
        assert line == {
            "conversations": [
                {"from": "human", "value": "<image>\nWhat is shown?"},
                {"from": "gpt", "value": samples[key]["txt"].decode()},
            ],
            "image": f"{key}.{ext}",
        }
        assert (tmp_path / "images" / line["image"]).read_bytes() == data
    assert len(list((tmp_path / "images").iterdir())) == 9
    assert summary["skipped"] == {"empty_caption": 1, "no_image": 1, "undecodable_image": 1}
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert (
        info
        == summary["dataset_info"]
        == {
            "data_dir": str(tmp_path.resolve() / "images"),
            "jsonl_path": str(tmp_path.resolve() / "data.jsonl"),
            "num_total_samples": 9,
        }
    )


def test_edit_rows_and_skips(tmp_path):
    pictures = {f"s{i}.png": cases.encode(cases.procedural(16, 16, seed=40 + i), "PNG") for i in range(4)}
    pictures["bad.jpg"] = cases.truncated_jpeg()
    (tmp_path / "src" / "pics").mkdir(parents=True)
    for name, data in pictures.items():
        (tmp_path / "src" / "pics" / name).write_bytes(data)
    absolute = str(tmp_path / "src" / "pics" / "s3.png")
    good = [
        {
            "images": ["pics/s0.png", "pics/s1.png", "pics/s2.png"],
            "instructions": [["make it red", "redden"], ["add a hat"]],
        },
        {"images": ["pics/s1.png", absolute], "instructions": [["zoom in"]]},
        {"images": ["pics/s2.png", "pics/s0.png"], "instructions": [["undo", "revert"]]},
    ]
    bad = [
        {"images": ["pics/s0.png", "pics/s1.png", "pics/s2.png"], "instructions": [["one step only"]]},
        {"images": ["pics/s0.png"], "instructions": []},
        {"images": ["pics/s0.png", "pics/gone.png"], "instructions": [["x"]]},
        {"images": ["pics/s0.png", "pics/bad.jpg"], "instructions": [["x"]]},
        {"images": ["pics/s0.png", "pics/s1.png"], "instructions": [[" "]]},
        {"images": "pics/s0.png", "instructions": [["x"]]},
    ]
    lines = [json.dumps(r) for r in good[:2] + bad] + ["", "{not json", json.dumps(good[2])]
    (tmp_path / "src" / "edits.jsonl").write_text("\n".join(lines) + "\n")

    summary = export_edit(
        str(tmp_path / "src" / "edits.jsonl"), str(tmp_path / "out"), rows_per_file=2, rows_per_row_group=1
    )
    rows = read_parts(tmp_path / "out")
    assert [r["image_list"] for r in rows] == [
        [Path(tmp_path / "src", p).read_bytes() for p in g["images"]] for g in good
    ]
    assert [r["instruction_list"] for r in rows] == [g["instructions"] for g in good]
    assert all(len(r["instruction_list"]) == len(r["image_list"]) - 1 for r in rows)
    assert summary["skipped"] == {
        "empty_instruction": 1, "instruction_count_mismatch": 1, "invalid_row": 2,
        "missing_image": 1, "too_few_images": 1, "undecodable_image": 1,
    }  # fmt: skip
    assert summary["dataset_info"]["num_files"] == 2 and summary["dataset_info"]["num_total_samples"] == 3
    check_parquet_info(tmp_path / "out", summary)


def test_refusals(dataset, tmp_path):
    root = dataset[0]
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "theirs.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="theirs.parquet"):
        export_t2i(root, str(tmp_path / "foreign"))
    with pytest.raises(ValueError, match="rows_per_row_group"):
        export_t2i(root, str(tmp_path / "a"), rows_per_file=2, rows_per_row_group=3)
    with pytest.raises(ValueError, match="<image>"):
        export_vlm(root, str(tmp_path / "b"), prompt="Look at <image>")
    tars = source_shards(root)
    with pytest.raises(ValueError, match="collide"):
        export_vlm([tars[0], tars[0]], str(tmp_path / "c"))
    with TarShardWriter(str(tmp_path / "empty" / "00000.tar")) as writer:
        writer.write("000000000", {"jpg": cases.truncated_jpeg(), "txt": b"broken"})
        writer.commit()
    with pytest.raises(ValueError, match="undecodable_image"):
        export_t2i(str(tmp_path / "empty"), str(tmp_path / "d"))
    assert not (tmp_path / "d" / "dataset_info.json").exists()
