"""BAGEL data contracts (FORMATS.md 5): the deterministic resize rule on hand-picked sizes, transparency on white,
file sharding that covers every file exactly once for several rank x worker layouts, and the JSONL line index."""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest
from PIL import Image

from unirl_core.data.bagel.jsonl import JsonLines, line_bounds
from unirl_core.data.bagel.sharding import ShardingError, assign_files, check_resume, layout_identity
from unirl_core.data.bagel.transforms import ImageTransformArgs, flatten_on_white, num_tokens, target_size, transform

VAE = ImageTransformArgs(image_stride=16, max_image_size=1024, min_image_size=512)
VIT = ImageTransformArgs(image_stride=14, max_image_size=980, min_image_size=378, max_pixels=2_007_040)


@pytest.mark.parametrize(
    ("size", "args", "count", "expected"),
    [
        ((1024, 1024), VAE, 1, (1024, 1024)),  # already in range
        ((4000, 3000), VAE, 1, (1024, 768)),  # long side capped at max_image_size
        ((300, 200), VAE, 1, (768, 512)),  # short side raised to min_image_size
        ((1000, 10), VAE, 1, (1024, 16)),  # extreme aspect: the long side wins, the short side keeps one stride
        ((1000, 1000), VIT, 1, (980, 980)),  # ViT stride 14: 980 = 70 x 14
        ((1000, 1000), VIT, 4, (714, 714)),  # 4 images share max_pixels: 980^2 > 2007040/4 -> shrink, re-round
    ],
)
def test_target_sizes_follow_the_rule(size, args, count, expected):
    width, height = target_size(*size, args, count)
    assert (width, height) == expected
    assert width % args.image_stride == 0 and height % args.image_stride == 0
    assert max(width, height) <= args.max_image_size


def test_transform_values_and_tokens():
    tensor = transform(Image.new("RGB", (300, 200), (255, 0, 128)), VAE)
    assert tensor.shape == (3, 512, 768)
    assert tensor.min() >= -1.0 and tensor.max() <= 1.0
    assert tensor[0].mean().item() == pytest.approx(1.0) and tensor[1].mean().item() == pytest.approx(-1.0)
    assert num_tokens(768, 512, 16) == 48 * 32


def test_transparency_is_pasted_on_white():
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))  # fully transparent red
    assert flatten_on_white(rgba).getpixel((0, 0)) == (255, 255, 255)
    palette = Image.new("P", (4, 4), 0)
    palette.putpalette([0, 0, 0] * 256)
    palette.info["transparency"] = 0
    assert flatten_on_white(palette).getpixel((1, 1)) == (255, 255, 255)


@pytest.mark.parametrize(("files", "ranks", "workers"), [(7, 1, 1), (7, 2, 3), (10, 3, 2), (23, 4, 2), (8, 8, 1)])
def test_every_file_is_read_exactly_once(files, ranks, workers):
    names = [f"part-{i:05d}.parquet" for i in range(files)]
    assigned = assign_files(list(reversed(names)), ranks, workers, seed=42)
    flat = [f for rank in assigned for worker in rank for f in worker]
    assert sorted(flat) == names  # no file twice, no remainder dropped
    sizes = [len(worker) for rank in assigned for worker in rank]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 2
    assert assigned == assign_files(names, ranks, workers, seed=42)  # the input order does not matter


def test_too_few_files_and_changed_layouts_are_refused():
    with pytest.raises(ShardingError, match=r"3 files cannot feed 2 ranks x 2 workers = 4 readers"):
        assign_files(["a", "b", "c"], 2, 2, seed=0)
    files = ["a", "b", "c", "d"]
    state = layout_identity(files, 2, 2, seed=0)
    check_resume(state, files, 2, 2, seed=0)
    with pytest.raises(ShardingError, match=r"world_size: 2 then, 4 now"):
        check_resume(state, files, 4, 1, seed=0)
    with pytest.raises(ShardingError, match=r"files_sha256"):
        check_resume(state, [*files, "e"], 2, 2, seed=0)


@pytest.mark.parametrize(("files", "ranks", "workers"), [(7, 2, 3), (23, 4, 2)])
def test_integer_units_shard_like_a_list_and_hash_by_value(files, ranks, workers):
    lines = np.arange(files, dtype=np.int64)  # vlm_sft's units: line numbers, as an array
    assigned = assign_files(lines[::-1].copy(), ranks, workers, seed=42)
    as_list = assign_files(list(range(files)), ranks, workers, seed=42)
    assert [[w.tolist() for w in rank] for rank in assigned] == as_list
    assert layout_identity(lines, 2, 2, 0) == layout_identity(lines[::-1].copy(), 2, 2, 0)
    assert layout_identity(lines, 2, 2, 0) != layout_identity(lines[:-1], 2, 2, 0)


def test_jsonl_index_splits_on_newlines_only_and_drops_blank_lines(tmp_path):
    rng = random.Random(0)
    pieces = [b"a", b" ", b"\n", b"\t", b"\r", b"{", "\u2028".encode(), b"\x0b"]
    for _ in range(2000):  # against the reference split, at chunk sizes that cut lines anywhere
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        expected = [line for line in data.split(b"\n") if line.strip(b" \t\n\r\x0b\x0c")]
        for chunk in (1, 3, 1 << 20):
            starts, ends = line_bounds(data, chunk)
            assert [data[s:e] for s, e in zip(starts, ends, strict=True)] == expected
    records = [{"text": "a raw \u2028 stays inside its line"}, {"k": 2}, {"k": 3}]
    body = "\r\n".join(json.dumps(r, ensure_ascii=False) for r in records[:2]) + "\n  \n\n" + json.dumps(records[2])
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())  # a UTF-8 BOM, CRLF, blank and whitespace lines, no final \n
    lines = JsonLines(str(path))  # memory-mapped
    assert [json.loads(lines[k]) for k in range(len(lines))] == records
    copy = pickle.loads(pickle.dumps(lines))  # what a spawn/forkserver DataLoader does to its dataset: reopened
    assert [copy[k] for k in range(len(copy))] == [lines[k] for k in range(len(lines))]
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert len(JsonLines(str(tmp_path / "empty.jsonl"))) == 0
