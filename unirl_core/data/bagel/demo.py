"""A small BAGEL mixture written from scratch (no download): t2i parquet, edit parquet, VLM JSONL + images (and a
video when PyAV is installed), a tiny tokenizer and the mixture YAML. `unirl bagel demo-data` and
`unirl bagel pack-stats demo` use it; tests and the packing benchmark build on it.

It carries a few deliberately bad rows (an undecodable image, a conversation without an answer, an edit row with
a missing instruction) so the skip counters have something to show.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from PIL import Image, ImageColor, ImageDraw

from unirl_core.data.bagel.tokenizer import write_tiny_tokenizer

COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "pink", "purple", "brown"]
THINGS = ["cat", "dog", "bird", "car", "tree", "house", "boat", "flower", "ball", "cup", "hat", "book"]
PLACES = ["table", "road", "beach", "mountain", "grass", "water", "bed", "floor", "street", "hill"]

# Scaled-down BAGEL settings: the same rules, images of 128-256 px and packs of 4096 tokens (BAGEL: 32768).
DEMO_PACKING = {
    "expected_num_tokens": 4096, "max_num_tokens": 4608, "max_num_tokens_per_sample": 2048,
    "prefer_buffer_before": 2048, "max_buffer_size": 50,
}  # fmt: skip
VAE_ARGS = {"image_stride": 16, "max_image_size": 256, "min_image_size": 128, "max_pixels": 65536}
VIT_ARGS = {"image_stride": 14, "max_image_size": 224, "min_image_size": 112, "max_pixels": 50176}


def _picture(rng: random.Random, mode: str = "RGB") -> tuple[bytes, str, str]:
    """PNG bytes of a colored object on a background, and its (thing, color)."""
    width, height = rng.choice([(96, 96), (128, 96), (96, 128), (160, 120), (200, 100), (80, 120)])
    color, thing = rng.choice(COLORS), rng.choice(THINGS)
    background = tuple(rng.randrange(256) for _ in range(3)) + ((0,) if mode == "RGBA" else ())
    image = Image.new(mode, (width, height), background)
    fill = ImageColor.getrgb(color) + ((255,) if mode == "RGBA" else ())
    box = [rng.randrange(width // 2), rng.randrange(height // 2), width - rng.randrange(width // 3),
           height - rng.randrange(height // 3)]  # fmt: skip
    ImageDraw.Draw(image).ellipse(box, fill=fill)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue(), thing, color


def _caption(rng: random.Random, thing: str, color: str) -> str:
    return f"a {color} {thing} on the {rng.choice(PLACES)}"


def _write_parquet(folder: Path, rows: list[dict], num_files: int, row_group_size: int, schema: pa.Schema) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(rows) // num_files)
    for index in range(num_files):
        table = pa.Table.from_pylist(rows[index * per_file : (index + 1) * per_file], schema=schema)
        pq.write_table(table, folder / f"part-{index:05d}.parquet", row_group_size=row_group_size)
    info = {str((folder / f"part-{i:05d}.parquet").resolve()): {"num_row_groups": pq.ParquetFile(
        folder / f"part-{i:05d}.parquet").num_row_groups} for i in range(num_files)}  # fmt: skip
    (folder / "parquet_info.json").write_text(json.dumps(info, indent=1))


def _t2i_rows(rng: random.Random, count: int) -> list[dict]:
    rows = []
    for index in range(count):
        data, thing, color = _picture(rng, "RGBA" if index % 7 == 3 else "RGB")
        captions = {str(k): _caption(rng, thing, color) for k in range(rng.randint(1, 3))}
        rows.append({"image": data, "captions": json.dumps(captions)})
    rows[5]["image"] = b"not an image"  # counted as bad_image
    return rows


def _edit_rows(rng: random.Random, count: int) -> list[dict]:
    rows = []
    for _ in range(count):
        steps = rng.randint(1, 3)
        images = [_picture(rng)[0] for _ in range(steps + 1)]
        instructions = [[f"make it {c}", f"change the color to {c}", f"turn it {c}"]
                        for c in rng.sample(COLORS, steps)]  # fmt: skip
        rows.append({"image_list": images, "instruction_list": instructions})
    rows[2]["instruction_list"] = rows[2]["instruction_list"][:-1]  # counted as instruction_count
    return rows


def _write_vlm(folder: Path, rng: random.Random, count: int) -> int:
    """The JSONL and its images; returns the number of lines (one more with the video, when PyAV is installed)."""
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for index in range(count):
        names, objects = [], []
        for k in range(1 if index % 4 else 2):
            data, thing, color = _picture(rng)
            names.append(f"{index:04d}_{k}.png")
            (images / names[-1]).write_bytes(data)
            objects.append(f"a {color} {thing}")
        question = "what is in this <image> ?" if len(names) == 1 else "compare <image> and <image> ."
        answer = " and ".join(objects)
        conversations = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        if index % 3 == 0:
            conversations += [{"from": "human", "value": "what color is it ?"}, {"from": "gpt", "value": "it is "
                              + objects[0].split()[1]}]  # fmt: skip
        lines.append({"conversations": conversations, "image": names if len(names) > 1 else names[0]})
    lines[1]["conversations"] = lines[1]["conversations"][:1]  # no answer: counted as no_loss
    if _write_video(images / "clip.mkv", rng):
        lines.append(
            {
                "conversations": [
                    {"from": "human", "value": "describe this <video> ."},
                    {"from": "gpt", "value": "a ball moving left to right"},
                ],
                "video": "clip.mkv",
            }
        )
    (folder / "data.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return len(lines)


def _write_video(path: Path, rng: random.Random, num_frames: int = 16) -> bool:
    try:
        import av
    except ImportError:
        return False
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=8)
        stream.width, stream.height, stream.pix_fmt = 128, 96, "bgr0"
        for index in range(num_frames):
            frame = np.zeros((96, 128, 3), dtype=np.uint8)
            frame[30:66, 4 + index * 7 : 28 + index * 7] = (255, 200, 0)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return True


def write_demo_mixture(folder: str | Path, t2i_rows: int = 96, edit_rows: int = 32, vlm_rows: int = 48,
                       seed: int = 0) -> Path:  # fmt: skip
    """Write the demo data under `folder`; returns the mixture YAML's path."""
    root = Path(folder).expanduser().resolve()
    rng = random.Random(seed)
    t2i_schema = pa.schema([("image", pa.binary()), ("captions", pa.string())])
    _write_parquet(root / "t2i", _t2i_rows(rng, t2i_rows), num_files=4, row_group_size=8, schema=t2i_schema)
    edit_schema = pa.schema(
        [("image_list", pa.list_(pa.binary())), ("instruction_list", pa.list_(pa.list_(pa.string())))]
    )
    _write_parquet(root / "edit", _edit_rows(rng, edit_rows), num_files=2, row_group_size=4, schema=edit_schema)
    vlm_lines = _write_vlm(root / "vlm", rng, vlm_rows)
    write_tiny_tokenizer(str(root / "tokenizer"))
    mixture = {
        "t2i_pretrain": {"dataset_names": ["demo_t2i"], "image_transform_args": VAE_ARGS, "is_mandatory": True,
                         "num_used_data": [4], "weight": 2},
        "unified_edit": {"dataset_names": ["demo_edit"], "image_transform_args": VAE_ARGS,
                         "vit_image_transform_args": VIT_ARGS, "num_used_data": [2], "weight": 1},
        "vlm_sft": {"dataset_names": ["demo_vlm"], "image_transform_args": VIT_ARGS,
                    "frame_sampler_args": {"max_num_frames": 12, "min_num_frames": 8}, "shuffle_lines": True,
                    "shuffle_seed": 0, "num_used_data": [vlm_lines], "weight": 1},
        "dataset_info": {  # entries as BAGEL's constructors take them (t2i: no parquet_info_path)
            "t2i_pretrain": {"demo_t2i": {"data_dir": "t2i", "num_files": 4, "num_total_samples": t2i_rows}},
            "unified_edit": {"demo_edit": {"data_dir": "edit", "num_files": 2, "num_total_samples": edit_rows,
                                           "parquet_info_path": "edit/parquet_info.json"}},
            "vlm_sft": {"demo_vlm": {"data_dir": "vlm/images", "jsonl_path": "vlm/data.jsonl",
                                     "num_total_samples": vlm_lines}},
        },
        "tokenizer": "tokenizer",
        "packing": DEMO_PACKING,
        "seed": seed,
    }  # fmt: skip
    path = root / "mixture.yaml"
    path.write_text(yaml.safe_dump(mixture, sort_keys=False))
    return path
