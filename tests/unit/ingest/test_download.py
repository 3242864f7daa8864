"""One work unit end to end (download_unit): zero-byte images, stable error messages, permanent disk errors."""

from __future__ import annotations

import errno
import re

import image_cases as cases
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest import images
from unirl_core.ingest.download import download_unit
from unirl_core.ingest.plan import WorkUnit
from unirl_core.io import storage

ROW_SCHEMA = pa.schema([("url", pa.string()), ("img", pa.binary()), ("caption", pa.string())])
EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
TIMING = ("duration", "start_time", "end_time")


def one_unit(tmp_path, rows: list[dict], root: str = "ds") -> tuple[IngestConfig, WorkUnit]:
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=ROW_SCHEMA), path)
    config = IngestConfig.model_validate(
        {
            "dataset_output_root": str(tmp_path / root),
            "download_parquet": {"parquet_pattern": str(path)},
            "download_images": {
                "image_bytes_col": "img",
                "allowed_private_networks": ["127.0.0.1/32"],
                "retries": 0,
                "error_budget": 1.0,
            },
        }
    )
    return config, WorkUnit(0, str(path), 0, len(rows))


def row_records(config: IngestConfig) -> list[dict]:
    return pq.read_table(f"{config.dataset_output_root}/raw/00000.parquet").to_pylist()


def test_zero_byte_images_are_decode_errors(tmp_path, image_server):
    empty_url = image_server.add("/download/empty.jpg", b"")  # 200 with an empty body
    rows = [
        {"url": None, "img": b"", "caption": "empty bytes"},
        {"url": empty_url, "img": None, "caption": "empty body"},
        {"url": None, "img": None, "caption": "nothing at all"},
        {"url": image_server.add("/download/ok.jpg", cases.jpeg(32, 24)), "img": b"", "caption": "URL fallback"},
    ]
    config, unit = one_unit(tmp_path, rows)
    stats = download_unit(config.dataset_output_root, unit, config)
    assert [r["skip_reason"] for r in row_records(config)] == ["decode_error", "decode_error", "no_image", None]
    assert stats["skip_reasons"] == {"decode_error": 2, "no_image": 1} and stats["successes"] == 1


def test_two_runs_over_the_same_bad_images_record_the_same_messages(tmp_path):
    bad = [cases.HTML, EPS, cases.truncated_jpeg(), b"GIF89a broken", cases.jpeg(40, 30)[:300]]
    rows = [{"url": None, "img": data, "caption": f"bad {i}"} for i, data in enumerate(bad)]
    runs = []
    for root in ("first", "second"):
        config, unit = one_unit(tmp_path, rows, root)
        stats = download_unit(config.dataset_output_root, unit, config)
        parquet = (tmp_path / root / "raw" / "00000.parquet").read_bytes()
        runs.append(({k: v for k, v in stats.items() if k not in TIMING}, parquet, row_records(config)))
    (first_stats, first_parquet, records), (second_stats, second_parquet, _) = runs
    assert first_stats == second_stats and first_parquet == second_parquet
    assert first_stats["skip_reasons"] == {"decode_error": 5}
    messages = [r["error_message"] for r in records]
    assert not [m for m in messages if re.search(r"0x[0-9a-f]{6,}", m)], messages
    assert "b'<!doctype html><'" in messages[0]  # still says what the bytes were


def test_a_full_disk_writing_the_unit_fails_it_naming_the_path(tmp_path, monkeypatch):
    config, unit = one_unit(tmp_path, [{"url": None, "img": cases.jpeg(32, 24), "caption": "ok"}])
    real_write = storage.write_bytes_atomic

    def disk_full_for_parquet(path, data):
        if path.endswith(".parquet"):
            raise OSError(errno.ENOSPC, "No space left on device")  # as an object store or pyarrow raises it
        real_write(path, data)

    monkeypatch.setattr(storage, "write_bytes_atomic", disk_full_for_parquet)
    with pytest.raises(storage.StorageError) as info:
        download_unit(config.dataset_output_root, unit, config)
    assert str(tmp_path / "ds" / "raw" / "00000.parquet") in str(info.value)
    assert "no space left on the device" in str(info.value)
    assert not (tmp_path / "ds" / "raw" / "00000_stats.json").exists()  # not committed

    monkeypatch.setattr(storage, "write_bytes_atomic", real_write)  # space freed: the re-run completes
    assert download_unit(config.dataset_output_root, unit, config)["successes"] == 1


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_permanent_os_error_while_processing_a_row_is_not_a_row_skip(tmp_path, monkeypatch, code):
    config, unit = one_unit(tmp_path, [{"url": None, "img": cases.jpeg(32, 24), "caption": "ok"}])

    def disk_trouble(data, options):
        raise OSError(code, "the machine, not the image")

    monkeypatch.setattr(images, "_process", disk_trouble)
    with pytest.raises(OSError) as info:
        download_unit(config.dataset_output_root, unit, config)
    assert info.value.errno == code
    assert not list((tmp_path / "ds" / "raw").glob("00000*"))
