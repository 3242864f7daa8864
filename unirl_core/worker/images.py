"""Image grids for sample and evaluation logs: rows of images, each row captioned with its prompt; a video shows as
a strip of its frames side by side (`frame_strip`)."""

from __future__ import annotations

import textwrap

from PIL import Image, ImageDraw, ImageFont

from unirl_core.data.video import Video, is_video, spaced_frames

STRIP_FRAMES = 4  # frames a video shows in a grid: evenly spaced, the first and the last included
STRIP_GAP = 4  # white pixels after each strip: where one video ends and the next begins in a row


def frame_strip(video: Video, count: int = STRIP_FRAMES) -> Image.Image:
    """`count` evenly spaced frames of `video` side by side (all of a shorter video), left to right in time, then
    STRIP_GAP white columns."""
    frames = spaced_frames(video, count)
    width, height = video.size
    strip = Image.new("RGB", (width * len(frames) + STRIP_GAP, height), "white")
    for i, frame in enumerate(frames):
        strip.paste(frame.convert("RGB"), (i * width, 0))
    return strip


def captioned_grid(images: list, captions: list[str], cols: int, caption_height: int = 24) -> Image.Image:
    """`len(captions)` rows of `cols` images (row i = images[i*cols:(i+1)*cols]), each row with its caption
    above it (wrapped, truncated to two lines). Videos show as frame strips."""
    if len(images) != len(captions) * cols:
        raise ValueError(f"{len(images)} images do not make {len(captions)} rows of {cols}")
    images = [frame_strip(image) if is_video(image) else image for image in images]
    width, height = images[0].size
    font = ImageFont.load_default()
    row_height = height + caption_height
    grid = Image.new("RGB", (max(cols * width, 160), len(captions) * row_height), "white")
    draw = ImageDraw.Draw(grid)
    chars = max(8, grid.width // 6)
    for row, caption in enumerate(captions):
        top = row * row_height
        lines = textwrap.wrap(caption, chars)[:2] or [""]
        draw.multiline_text((2, top + 1), "\n".join(lines), fill="black", font=font, spacing=1)
        for col in range(cols):
            grid.paste(images[row * cols + col].convert("RGB"), (col * width, top + caption_height))
    return grid


def titled(grid: Image.Image, title: str, title_height: int = 14) -> Image.Image:
    """`grid` over a one-line caption (the step it shows: MLflow's image card names no step). The caption goes
    below: the card shows an image's top when it is too tall for it, and that should be the pictures."""
    out = Image.new("RGB", (grid.width, grid.height + title_height), "white")
    out.paste(grid, (0, 0))
    ImageDraw.Draw(out).text((2, grid.height + 1), title, fill="black", font=ImageFont.load_default())
    return out
