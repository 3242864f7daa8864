"""`unirl rewards`: list the reward names, score your own images or videos with any of them, check a recipe's
rewards load and score (with timings) before a run spends GPUs on them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from flows.cli_tables import echo_table
from unirl_core.errors import UserError

rewards_app = typer.Typer(help="List, try and check rewards (`train.reward`).", no_args_is_help=True)

SET_HELP = "Override a recipe value: dotted.key=value (repeatable), e.g. train.reward.pickscore.model_path=DIR."


def _reward_config(recipe: str | None, overrides: list[str] | None):
    """`train.reward` of `recipe`, or of an empty recipe (weight-free rewards; model ones through --set)."""
    from unirl_core.config import load_recipe, recipe_from_tree

    if recipe:
        return load_recipe(recipe, overrides or []).train.reward
    return recipe_from_tree({"train": {"data": {"source": "smoke"}}}, overrides or []).train.reward


@rewards_app.command("list")
def rewards_list() -> None:
    """The reward names `train.reward.weights` and `guards` accept, what each scores and what it needs."""
    from unirl_core.rewards.registry import DESCRIPTIONS

    rows = [("reward", "scores", "needs")]
    rows += [(name, what, needs) for name, (what, needs) in DESCRIPTIONS.items()]
    rows.append(("<any key>", "an HTTP scorer's score (the remote contract)", "reward.remote.<key>.url"))
    echo_table(rows)


FramesOption = Annotated[
    str | None,
    typer.Option(help="Videos: the frames image rewards score, first | mean | min (default: the recipe's "
                 "train.reward.video.frames, else first)."),
]  # fmt: skip
SampleFramesOption = Annotated[
    int | None,
    typer.Option(help="Videos, with mean or min: frames scored per video, evenly spaced (default: the recipe's "
                 "train.reward.video.sample_frames, else 4).", min=1),
]  # fmt: skip


@rewards_app.command("score")
def rewards_score(
    images: Annotated[
        list[Path],
        typer.Argument(help="Image files (any format Pillow reads), or video files (.mp4, .webm, .mov, .mkv, .avi)."),
    ],
    reward: Annotated[list[str], typer.Option("--reward", "-r", help="Reward name (repeatable).")],
    prompt: Annotated[str | None, typer.Option(help="The prompt of every image.")] = None,
    prompts_file: Annotated[
        Path | None, typer.Option(help="One prompt per line, one line per image, in order.")
    ] = None,
    metadata_file: Annotated[
        Path | None, typer.Option(help="JSONL: one object per image, in order (GenEval's record, for geneval).")
    ] = None,
    recipe: Annotated[str | None, typer.Option(help="Take `train.reward` (model folders) from this recipe.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help=SET_HELP)] = None,
    frames: FramesOption = None,
    sample_frames: SampleFramesOption = None,
) -> None:
    """Score IMAGES (or videos) with each --reward: one row per file, one column per reward. Image rewards score a
    video's frames, aggregated as `train.reward.video` (or --frames) says."""
    from unirl_core.rewards.registry import build_scorers
    from unirl_core.rewards.service import RewardService

    prompts = _prompts(prompt, prompts_file, len(images))
    loaded = _outputs(images)
    config = _reward_config(recipe, set_).model_copy(update={"weights": dict.fromkeys(reward, 1.0), "guards": []})
    video = _video_settings(config.video, frames, sample_frames)
    try:
        service = RewardService(config.weights, [], build_scorers(config), video, per_frame=list(config.remote))
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    metadata = _metadata(metadata_file, len(images)) if metadata_file else None
    scores = service.score(loaded, prompts, [str(p) for p in images], metadata)
    rows = [("image", "prompt", *reward)]
    for i, path in enumerate(images):
        shown = prompts[i] if len(prompts[i]) <= 40 else prompts[i][:37] + "..."
        rows.append((str(path), shown, *(f"{scores[name][i]:.4f}" for name in reward)))
    echo_table(rows)


def _prompts(prompt: str | None, prompts_file: Path | None, count: int) -> list[str]:
    if prompt is not None and prompts_file is not None:
        raise UserError("give --prompt or --prompts-file, not both")
    if prompts_file is None:
        return [prompt or ""] * count
    prompts = prompts_file.read_text(encoding="utf-8").splitlines()
    if len(prompts) != count:
        raise UserError(f"--prompts-file {prompts_file} has {len(prompts)} lines for {count} images: one each")
    return prompts


def _outputs(paths: list[Path]) -> list:
    """The files as RGB images or, by their suffix, as videos (`unirl_core.data.video.Video`); not both kinds."""
    from PIL import Image

    from unirl_core.data.video import VIDEO_SUFFIXES, read_video

    videos = [path.suffix.lower() in VIDEO_SUFFIXES for path in paths]
    if any(videos) and not all(videos):
        raise UserError("give image files or video files, not both: image rewards score a video's frames")
    loaded = []
    for path in paths:
        try:
            if path.suffix.lower() in VIDEO_SUFFIXES:
                loaded.append(read_video(path))
                continue
            with Image.open(path) as image:
                loaded.append(image.convert("RGB"))
        except OSError as exc:
            raise UserError(f"{path}: not an image Pillow can read ({exc})") from None
        except ValueError as exc:  # read_video's, naming the file
            raise UserError(str(exc)) from None
    return loaded


def _video_settings(section, frames: str | None, sample_frames: int | None):
    """`train.reward.video` with the command's --frames / --sample-frames over it."""
    from pydantic import ValidationError

    updates = {k: v for k, v in {"frames": frames, "sample_frames": sample_frames}.items() if v is not None}
    try:
        return type(section).model_validate(section.model_dump() | updates)
    except ValidationError:
        raise UserError(f"--frames {frames}: choose first, mean or min") from None


def _metadata(path: Path, count: int) -> list[dict]:
    import json

    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise UserError(f"--metadata-file {path} line {number}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise UserError(
                f"--metadata-file {path} line {number}: a JSON object per line, got {type(record).__name__}"
            )
        records.append(record)
    if len(records) != count:
        raise UserError(f"--metadata-file {path} has {len(records)} lines for {count} images: one each")
    return records


@rewards_app.command("check")
def rewards_check(
    recipe: Annotated[str, typer.Argument(help="Recipe name or file.")],
    batch: Annotated[int, typer.Option(help="Placeholder images scored per reward.", min=1)] = 8,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help=SET_HELP)] = None,
) -> None:
    """Load every reward RECIPE weights or guards and score a batch of placeholder images (videos, for a video
    family) at its sampling size with the recipe's first prompts (and their metadata): the load time, the seconds
    per image and the scores' range, per reward. Exit 2 if one cannot load or score."""
    from unirl_core.config import load_recipe
    from unirl_core.data.sources import build_source
    from unirl_core.rewards.registry import build_scorers
    from unirl_core.rewards.service import RewardService

    train = load_recipe(recipe, set_ or []).train
    config = train.reward
    images = _placeholders(train, batch)
    try:
        examples = build_source(train.data).next_batch()
    except (OSError, ValueError) as exc:
        raise UserError(f"train.data: cannot read the recipe's prompts ({exc})") from None
    examples = [examples[i % len(examples)] for i in range(batch)]
    prompts, metadata = [e.prompt for e in examples], [e.metadata for e in examples]
    rows = [("reward", "role", "load s", "s/image", "min", "max")]
    for name in [*config.weights, *[g for g in config.guards if g not in config.weights]]:
        role = f"weight {config.weights[name]:g}" if name in config.weights else "guard"
        single = config.model_copy(update={"weights": {name: 1.0}, "guards": []})
        started = time.perf_counter()
        try:
            service = RewardService(single.weights, [], build_scorers(single), single.video, list(single.remote))
        except (ValueError, FileNotFoundError, OSError) as exc:
            raise UserError(f"reward {name}: {exc}") from None
        loaded = time.perf_counter()
        try:
            scores = service.score(images, prompts, [f"check:{i}" for i in range(batch)], metadata)[name]
        except ValueError as exc:
            raise UserError(f"reward {name}: {exc}") from None
        per_image = (time.perf_counter() - loaded) / batch
        rows.append((name, role, f"{loaded - started:.2f}", f"{per_image:.4f}", f"{scores.min():.4f}",
                     f"{scores.max():.4f}"))  # fmt: skip
    echo_table(rows)


def _placeholders(train, batch: int) -> list:
    """`batch` random images at the recipe's sampling size, or videos of its `num_frames` (5 when unset) for a
    family whose outputs are videos."""
    import numpy as np
    from PIL import Image

    from unirl_core.data.video import Video
    from unirl_core.domains.registry import domain_class

    sampling, rng = train.sampling, np.random.default_rng(0)
    videos = domain_class(train.domain.name).outputs_of(train) == "video"
    frames = (getattr(sampling, "num_frames", None) or 5) if videos else 1
    images = [[Image.fromarray(rng.integers(0, 256, (sampling.height, sampling.width, 3), dtype=np.uint8))
               for _ in range(frames)] for _ in range(batch)]  # fmt: skip
    return [Video(tuple(f), getattr(sampling, "fps", None) or 16.0) if videos else f[0] for f in images]
