"""Work-unit planning and row reading for parquet, jsonl and csv inputs; caption columns; HF image structs."""

from __future__ import annotations

import json

import image_cases as cases
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from unirl_core.config.ingest import IngestConfig
from unirl_core.ingest.download import download_unit
from unirl_core.ingest.plan import IngestInputError, Plan, WorkUnit, list_inputs, plan_units, split_rows


def config(tmp_path, pattern, **images) -> IngestConfig:
    return IngestConfig.model_validate(
        {
            "dataset_output_root": str(tmp_path / "out"),
            "download_parquet": {"parquet_pattern": pattern, "rows_per_unit": 4},
            "download_images": {"allowed_private_networks": ["127.0.0.1/32"], "resize_mode": "no", **images},
        }
    )


def test_split_rows_by_rows_per_unit_and_subpartitions(tmp_path):
    c = config(tmp_path, "x")
    assert split_rows(10, c) == [(0, 4), (4, 8), (8, 10)]
    c.download_parquet.parquet_subpartitions = 3
    assert split_rows(10, c) == [(0, 3), (3, 6), (6, 10)]
    assert split_rows(25_000, c) == [(0, 8333), (8333, 16666), (16666, 25000)]


def test_list_inputs_sorts_and_refuses_empty_patterns(tmp_path):
    for name in ("b.parquet", "a.parquet", "c.csv"):
        (tmp_path / name).write_text("x")
    assert list_inputs([str(tmp_path / "*.parquet"), str(tmp_path / "c.csv")]) == [
        str(tmp_path / n) for n in ("a.parquet", "b.parquet", "c.csv")
    ]
    with pytest.raises(IngestInputError, match=r"matches no file"):
        list_inputs([str(tmp_path / "*.jsonl")])


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_jsonl_and_csv_inputs(tmp_path, image_server, fmt):
    rows = [
        {"url": image_server.add(f"/plan/{fmt}/{i}.jpg", cases.jpeg(64, 48, seed=i)), "caption": f"c{i}"}
        for i in range(6)
    ]
    path = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        path.write_text("url,caption\n" + "".join(f"{r['url']},{r['caption']}\n" for r in rows))
    c = config(tmp_path, str(path))
    units = plan_units(c, Plan()).units
    assert [(u.start, u.stop) for u in units] == [(0, 4), (4, 6)]
    stats = [download_unit(c.dataset_output_root, u, c) for u in units]
    assert [s["successes"] for s in stats] == [4, 2]


def test_a_changed_or_duplicated_input_is_refused(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"url": ["http://x/1.jpg"] * 3, "caption": ["a", "b", "c"]}), path)
    c = config(tmp_path, str(path))
    planned = plan_units(c, Plan())
    assert plan_units(c, planned) == planned
    pq.write_table(pa.table({"url": ["http://x/1.jpg"] * 3, "caption": ["x", "y", "z"]}), path)  # same rows, new text
    with pytest.raises(IngestInputError, match="changed since it was ingested"):
        plan_units(c, planned)
    pq.write_table(pa.table({"url": ["http://x/1.jpg"] * 3, "caption": ["a", "b", "c"]}), path)
    (tmp_path / "copy.parquet").write_bytes(path.read_bytes())
    c.download_parquet.parquet_pattern = [str(tmp_path / "*.parquet")]
    with pytest.raises(
        IngestInputError,
        match=r"in\.parquet has the same content as .*copy\.parquet|copy\.parquet has the same content",
    ):
        plan_units(c, planned)


def test_bagel_captions_json_and_hf_image_struct(tmp_path):
    image = {"bytes": cases.jpeg(80, 60, seed=5), "path": "a.jpg"}
    table = pa.Table.from_pylist(
        [
            {"image": image, "captions": json.dumps({"1": "second", "0": "first"})},
            {"image": image, "captions": "{not json"},
        ]
    )
    pq.write_table(table, tmp_path / "t2i.parquet")
    c = config(
        tmp_path, str(tmp_path / "t2i.parquet"), url_col=None, caption_col=None, image_bytes_col="image",
        captions_json_col="captions", error_budget=1.0,
    )  # fmt: skip
    (unit,) = plan_units(c, Plan()).units
    assert unit == WorkUnit(0, str(tmp_path / "t2i.parquet"), 0, 2)
    stats = download_unit(c.dataset_output_root, unit, c)
    assert stats["successes"] == 1 and stats["skip_reasons"] == {"bad_caption": 1}
    from unirl_core.io.tars import iter_samples

    ((key, members),) = list(iter_samples(str(tmp_path / "out" / "raw" / "00000.tar")))
    assert members["txt"] == b"first"
    assert json.loads(members["json"])["captions"] == {"0": "first", "1": "second"}


def test_copy_inputs_and_binary_captions(tmp_path):
    image = cases.jpeg(64, 48, seed=9)
    table = pa.table({"img": [image, image, image], "caption": pa.array([b"ok", b"\xff\xfe bad", None], pa.binary())})
    pq.write_table(table, tmp_path / "src.parquet")
    c = config(tmp_path, str(tmp_path / "src.parquet"), url_col=None, image_bytes_col="img", error_budget=1.0)
    c.download_parquet.copy_inputs = True
    plan = plan_units(c, Plan())
    (unit,) = plan.units
    copy = tmp_path / "out" / "inputs" / "src.parquet"
    assert unit.file == str(copy) and copy.read_bytes() == (tmp_path / "src.parquet").read_bytes()
    stats = download_unit(c.dataset_output_root, unit, c)
    assert stats["successes"] == 2 and stats["skip_reasons"] == {"bad_caption": 1}  # null caption stored empty
    assert plan_units(c, plan) == plan  # the copy is reused, the plan unchanged


def test_csv_captions_of_digits_are_text_and_rows_seek_row_groups(tmp_path, image_server):
    url = image_server.add("/plan/digits.jpg", cases.jpeg(64, 48, seed=3))
    (tmp_path / "d.csv").write_text("url,caption\n" + "".join(f"{url},{1990 + i}\n" for i in range(5)))
    c = config(tmp_path, str(tmp_path / "d.csv"))
    units = plan_units(c, Plan()).units
    stats = [download_unit(c.dataset_output_root, u, c) for u in units]
    assert sum(s["successes"] for s in stats) == 5
    from unirl_core.ingest.plan import iter_rows

    pq.write_table(pa.table({"n": list(range(100))}), tmp_path / "rg.parquet", row_group_size=10)
    assert [p for p, _ in iter_rows(str(tmp_path / "rg.parquet"), ["n"], 35, 52)] == list(range(35, 52))
    assert [r["n"] for _, r in iter_rows(str(tmp_path / "rg.parquet"), ["n"], 95, 100)] == [95, 96, 97, 98, 99]


def test_reserved_additional_columns_are_refused():
    from unirl_core.config import RecipeError, recipe_from_tree

    with pytest.raises(RecipeError, match=r"save_additional_columns: got \['key', 'status'\]"):
        recipe_from_tree(
            {
                "ingest": {
                    "download_parquet": {"parquet_pattern": "x"},
                    "download_images": {"save_additional_columns": ["key", "status", "ok"]},
                }
            }
        )
