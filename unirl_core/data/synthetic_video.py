"""A synthetic video-text dataset for the video demo and tests: short clips of a shape moving across a background,
with captions that describe them, plus bad rows so the ingest's and the precache's skip accounting shows.

    write_synthetic_video_parquet(path, rows=8, seed=0)  -> a parquet file: caption, video (file bytes or null), url
    synthetic_video_prompts(rows, seed)                  -> the good clips' captions (the demo's RL prompts)

Good clips: 16 to 24 frames of `size` x `size` at 12 fps (1.3 to 2 s), H.264 mp4, every fourth one VP9 webm (ingest
re-encodes it to mp4). With `bad_rows`, four more rows: a truncated mp4 (`truncated`), a 6 s clip (`too_long`
under the pipeline_video recipe's `ingest.video.max_seconds: 5`), PNG bytes (`not_a_video`), and a 4-frame clip
that ingest keeps but precache skips (`too_short`: shorter than the recipe's 9 frames at 8 fps). Everything is
drawn from `seed`, and the encoders are deterministic: the same call writes the same bytes. No network.
"""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
from PIL import Image, ImageDraw

from unirl_core.data.synthetic import COLOURS, _a, _pick_two, _png, synthetic_image
from unirl_core.data.video import Video, encode_mp4

CLIP_FPS = 12.0
DIRECTIONS = {"right": (1, 0), "left": (-1, 0), "down": (0, 1), "up": (0, -1)}


def synthetic_clip(index: int, seed: int = 0, size: int = 32, num_frames: int | None = None) -> tuple[Video, str]:
    """Clip `index` drawn from `seed` (16 to 24 frames unless `num_frames`), and its caption."""
    rng = np.random.default_rng([seed, index, 1])
    fg, bg = _pick_two(rng)
    shape = str(rng.choice(["circle", "square"]))
    direction = str(rng.choice(list(DIRECTIONS)))
    frames = num_frames or 16 + index % 9
    side = size // 3
    frames_out = []
    for t in range(frames):
        travel = round((size - side) * t / max(frames - 1, 1))
        dx, dy = DIRECTIONS[direction]
        x = travel if dx > 0 else size - side - travel if dx < 0 else (size - side) // 2
        y = travel if dy > 0 else size - side - travel if dy < 0 else (size - side) // 2
        image = Image.new("RGB", (size, size), COLOURS[bg])
        draw = ImageDraw.Draw(image)
        (draw.ellipse if shape == "circle" else draw.rectangle)((x, y, x + side, y + side), fill=COLOURS[fg])
        frames_out.append(image)
    return Video(tuple(frames_out), CLIP_FPS), f"{_a(fg)} {shape} moving {direction} on {_a(bg)} background"


def encode_webm(video: Video) -> bytes:
    """`video` as a VP9 webm (yuv420p) at its frame rate."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="webm") as container:
        container.flags |= av.container.Flags.bitexact.value  # Matroska's track and segment UIDs: not random
        stream = container.add_stream("libvpx-vp9", rate=Fraction(video.fps).limit_denominator(1001))
        stream.width, stream.height = video.size
        stream.pix_fmt = "yuv420p"
        for frame in video.frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.asarray(frame), format="rgb24")):
                container.mux(packet)
        container.mux(stream.encode())
    return buffer.getvalue()


def _bad_rows(seed: int, size: int) -> list[dict]:
    clip, _ = synthetic_clip(1000, seed, size)
    whole = encode_mp4(clip)
    long_clip = Video(synthetic_clip(1001, seed, size, num_frames=24)[0].frames, fps=4.0)  # 6 s
    short_clip, short_caption = synthetic_clip(1002, seed, size, num_frames=4)
    return [
        {"caption": "a truncated video", "video": whole[: len(whole) // 2], "url": None},
        {"caption": "a video that is too long", "video": encode_mp4(long_clip), "url": None},
        {"caption": "an image, not a video", "video": _png(synthetic_image(0, seed, size)[0]), "url": None},
        {"caption": short_caption, "video": encode_mp4(short_clip), "url": None},
    ]


def synthetic_video_rows(rows: int = 8, seed: int = 0, size: int = 32, bad_rows: bool = True) -> list[dict]:
    """`rows` good clips with (with `bad_rows`) the four bad rows spread among them."""
    table = []
    for index in range(rows):
        clip, caption = synthetic_clip(index, seed, size)
        data = encode_webm(clip) if index % 4 == 3 else encode_mp4(clip)
        table.append({"caption": caption, "video": data, "url": None})
    if bad_rows:
        for position, row in zip((rows // 5, 2 * rows // 5, 3 * rows // 5, 4 * rows // 5), _bad_rows(seed, size), strict=True):  # fmt: skip
            table.insert(position, row)
    return table


def synthetic_video_prompts(rows: int = 8, seed: int = 0) -> list[str]:
    """The good clips' captions, in order (distinct captions only)."""
    return list(dict.fromkeys(synthetic_clip(i, seed, 8, num_frames=1)[1] for i in range(rows)))


def write_synthetic_video_parquet(path: str, rows: int = 8, seed: int = 0, size: int = 32, bad_rows: bool = True) -> str:  # fmt: skip
    """Write the dataset as one parquet file (atomic); returns its path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from unirl_core.io.storage import write_bytes_atomic

    table = pa.Table.from_pylist(
        synthetic_video_rows(rows, seed, size, bad_rows),
        schema=pa.schema([("caption", pa.string()), ("video", pa.binary()), ("url", pa.string())]),
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_bytes_atomic(path, sink.getvalue().to_pybytes())
    return path
