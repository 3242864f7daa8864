"""The error budget through the stage functions: which units are judged on their own, and the whole dataset."""

from __future__ import annotations

import json

import image_cases as cases
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest.budget import ErrorBudgetExceeded
from unirl_core.ingest.download import COMMITTED_NOW
from unirl_core.ingest.stages import download_unit, stage_download_parquet, stage_reorganize_tar

GOOD, BAD = cases.jpeg(32, 24, seed=1), cases.HTML  # BAD: a decode_error


def dataset(tmp_path, images: list[bytes], rows_per_unit: int, **download_images) -> IngestConfig:
    pq.write_table(
        pa.table({"img": images, "caption": [f"row {i}" for i in range(len(images))]}), tmp_path / "in.parquet"
    )
    return IngestConfig.model_validate(
        {
            "dataset_output_root": str(tmp_path / "ds"),
            "download_parquet": {"parquet_pattern": str(tmp_path / "in.parquet"), "rows_per_unit": rows_per_unit},
            "download_images": {"url_col": None, "image_bytes_col": "img", "resize_mode": "no", **download_images},
            "reorganize_tar": {"tar_chunk_size": 4},
        }
    )


def download_all(config: IngestConfig) -> list[dict]:
    return [download_unit(config.dataset_output_root, u, config) for u in stage_download_parquet(config)]


def without_mark(stats: dict) -> dict:
    """The stats as committed: without the mark of a unit committed by this call."""
    return {k: v for k, v in stats.items() if k != COMMITTED_NOW}


def test_a_unit_of_enough_rows_over_budget_fails_before_it_is_committed(tmp_path):
    config = dataset(tmp_path, [GOOD] * 4 + [BAD] * 6, rows_per_unit=10, error_budget_min_rows=10)
    with pytest.raises(ErrorBudgetExceeded, match=r"unit 00000 .* 6 of 10 rows skipped \(60% > error_budget 50%\)"):
        download_all(config)
    assert not list((tmp_path / "ds" / "raw").glob("00000*"))  # nothing under a final name
    config.download_images.error_budget_min_rows = 11  # one row short of being judged alone: committed
    assert download_all(config)[0]["skip_reasons"] == {"decode_error": 6}


def test_a_dataset_bad_as_a_whole_fails_before_any_shard_and_keeps_its_units(tmp_path):
    # units of 5 rows (below error_budget_min_rows 100): 1 of 5 and 5 of 5 bad, 60% in all
    config = dataset(tmp_path, [GOOD] * 4 + [BAD] * 6, rows_per_unit=5)
    stats = download_all(config)
    assert [s["count"] - s["successes"] for s in stats] == [1, 5]  # both committed
    units = stage_download_parquet(config)
    with pytest.raises(ErrorBudgetExceeded) as info:
        stage_reorganize_tar(config, units)
    assert "(2 units): 6 of 10 rows skipped (60% > error_budget 50%); reasons: decode_error: 6" in str(info.value)
    assert "worst units: 00001 (5 of 5), 00000 (1 of 5)" in str(info.value)
    assert not (tmp_path / "ds" / "shards").exists()

    config.download_images.error_budget = 0.6  # a re-run with a looser budget reuses the committed units
    assert download_all(config) == [without_mark(s) for s in stats]  # not committed again: no COMMITTED_NOW
    assert stage_reorganize_tar(config, units)["samples"] == 4


def test_every_unit_small_and_all_bad_still_fails(tmp_path):
    config = dataset(tmp_path, [BAD] * 6, rows_per_unit=2)
    assert len(download_all(config)) == 3
    with pytest.raises(ErrorBudgetExceeded, match=r"6 of 6 rows skipped \(100% > error_budget 50%\)"):
        stage_reorganize_tar(config, stage_download_parquet(config))
    assert not (tmp_path / "ds" / "shards").exists()


def test_changing_error_budget_min_rows_keeps_committed_units(tmp_path):
    config = dataset(tmp_path, [GOOD] * 3, rows_per_unit=3)
    (first,) = download_all(config)
    assert first[COMMITTED_NOW]
    first = without_mark(first)
    config.download_images.error_budget_min_rows = 1
    assert download_all(config) == [first]  # not an output setting: no "committed with other settings" error
    assert json.loads((tmp_path / "ds" / "raw" / "00000_stats.json").read_text()) == first
