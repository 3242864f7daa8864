"""A synthetic image-text dataset for the demo: procedural images (shapes, gradients, stripes, noise) with captions
that describe them, plus a few bad rows so the ingest's skip accounting shows.

    write_synthetic_parquet(path, rows=64, seed=0)  -> a parquet file: caption, image (PNG bytes or null), url
    synthetic_prompts(rows, seed)                   -> the captions (the demo's RL prompts)

Everything is drawn from `seed`: the same call writes the same bytes. No network: good rows carry their bytes; the
bad rows are a corrupt image, a row with a private-address URL (refused by ingest's download guard) and a row
without an image.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
}
KINDS = ("shape", "gradient", "stripes", "noise")


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _pick_two(rng: np.random.Generator) -> tuple[str, str]:
    first, second = rng.choice(list(COLOURS), size=2, replace=False)
    return str(first), str(second)


def synthetic_image(index: int, seed: int = 0, size: int = 64) -> tuple[Image.Image, str]:
    """Image `index` of the dataset drawn from `seed`, and its caption."""
    rng = np.random.default_rng([seed, index])
    kind = KINDS[index % len(KINDS)]
    fg, bg = _pick_two(rng)
    if kind == "shape":
        shape = str(rng.choice(["circle", "square", "triangle"]))
        image = Image.new("RGB", (size, size), COLOURS[bg])
        draw = ImageDraw.Draw(image)
        lo, hi = size // 5, size - size // 5
        if shape == "circle":
            draw.ellipse((lo, lo, hi, hi), fill=COLOURS[fg])
        elif shape == "square":
            draw.rectangle((lo, lo, hi, hi), fill=COLOURS[fg])
        else:
            draw.polygon([(size // 2, lo), (hi, hi), (lo, hi)], fill=COLOURS[fg])
        return image, f"{_a(fg)} {shape} on {_a(bg)} background"
    if kind == "gradient":
        vertical = bool(rng.integers(0, 2))
        ramp = np.linspace(0.0, 1.0, size)[:, None] if vertical else np.linspace(0.0, 1.0, size)[None, :]
        ramp = np.broadcast_to(ramp, (size, size))[..., None]
        pixels = (1 - ramp) * np.array(COLOURS[fg]) + ramp * np.array(COLOURS[bg])
        direction = "vertical" if vertical else "horizontal"
        return Image.fromarray(pixels.astype(np.uint8), "RGB"), f"a {direction} gradient from {fg} to {bg}"
    if kind == "stripes":
        count = int(rng.integers(2, 6))
        horizontal = bool(rng.integers(0, 2))
        coordinate = np.arange(size)[:, None] if horizontal else np.arange(size)[None, :]
        band = (coordinate * count * 2 // size) % 2
        band = np.broadcast_to(band, (size, size))[..., None]
        pixels = np.where(band == 0, np.array(COLOURS[fg]), np.array(COLOURS[bg]))
        direction = "horizontal" if horizontal else "vertical"
        return Image.fromarray(pixels.astype(np.uint8), "RGB"), f"{count * 2} {direction} {fg} and {bg} stripes"
    pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    tint = np.array(COLOURS[fg], dtype=np.float32) / 255.0
    return Image.fromarray((pixels * (0.5 + 0.5 * tint)).astype(np.uint8), "RGB"), f"colourful {fg}-tinted noise"


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def synthetic_rows(rows: int = 64, seed: int = 0, size: int = 64, bad_rows: bool = True) -> list[dict]:
    """`rows` good rows with (with `bad_rows`) three that ingest skips and counts by reason, spread among them."""
    table = []
    for index in range(rows):
        image, caption = synthetic_image(index, seed, size)
        table.append({"caption": caption, "image": _png(image), "url": None})
    if bad_rows:
        bad = [
            {"caption": "a corrupt image", "image": b"\x89PNG\r\n\x1a\nnot really a png", "url": None},
            {"caption": "an image behind a private address", "image": None, "url": "http://10.0.0.7/cat.jpg"},
            {"caption": "a row without an image", "image": None, "url": None},
        ]
        for position, row in zip((rows // 4, rows // 2, 3 * rows // 4), bad, strict=True):
            table.insert(position, row)
    return table


def synthetic_prompts(rows: int = 64, seed: int = 0) -> list[str]:
    """The good rows' captions, in order (distinct captions only)."""
    return list(dict.fromkeys(synthetic_image(i, seed, 8)[1] for i in range(rows)))


def write_synthetic_parquet(path: str, rows: int = 64, seed: int = 0, size: int = 64, bad_rows: bool = True) -> str:
    """Write the dataset as one parquet file (atomic); returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from unirl_core.io.storage import write_bytes_atomic

    table = pa.Table.from_pylist(
        synthetic_rows(rows, seed, size, bad_rows),
        schema=pa.schema([("caption", pa.string()), ("image", pa.binary()), ("url", pa.string())]),
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_bytes_atomic(path, sink.getvalue().to_pybytes())
    return path


def write_synthetic_edit_prompts(folder: str, rows: int = 8, seed: int = 0, size: int = 64) -> str:
    """Edit prompts for the edit families' demo and tests: `rows` JSON lines, each an instruction towards a
    synthetic caption with a condition image (a synthetic image of another seed, written as a PNG next to the file,
    `media_refs` role "condition"). Returns the JSONL's path."""
    import json
    from pathlib import Path

    from unirl_core.io.storage import write_bytes_atomic

    out = Path(folder)
    lines = []
    for index, caption in enumerate(synthetic_prompts(rows, seed)):
        image, _ = synthetic_image(index, seed + 1, size)
        uri = out / f"condition-{index:04d}.png"
        write_bytes_atomic(str(uri), _png(image))
        refs = [{"modality": "image", "role": "condition", "uri": str(uri)}]
        lines.append(json.dumps({"prompt": f"turn this into {caption}", "media_refs": refs}))
    path = out / f"edit-prompts-{rows}.jsonl"
    write_bytes_atomic(str(path), ("\n".join(lines) + "\n").encode())
    return str(path)
