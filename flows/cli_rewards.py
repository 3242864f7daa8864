"""`unirl rewards`: list the reward names, score your own images with any of them, check a recipe's rewards load
and score (with timings) before a run spends GPUs on them."""

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


@rewards_app.command("score")
def rewards_score(
    images: Annotated[list[Path], typer.Argument(help="Image files (any format Pillow reads).")],
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
) -> None:
    """Score IMAGES with each --reward: one row per image, one column per reward."""
    from PIL import Image

    from unirl_core.rewards.registry import build_scorers
    from unirl_core.rewards.service import RewardService

    if prompt is not None and prompts_file is not None:
        raise UserError("give --prompt or --prompts-file, not both")
    prompts = [prompt or ""] * len(images)
    if prompts_file is not None:
        prompts = prompts_file.read_text(encoding="utf-8").splitlines()
        if len(prompts) != len(images):
            raise UserError(
                f"--prompts-file {prompts_file} has {len(prompts)} lines for {len(images)} images: one each"
            )
    loaded = []
    for path in images:
        try:
            with Image.open(path) as image:
                loaded.append(image.convert("RGB"))
        except OSError as exc:
            raise UserError(f"{path}: not an image Pillow can read ({exc})") from None
    config = _reward_config(recipe, set_).model_copy(update={"weights": dict.fromkeys(reward, 1.0), "guards": []})
    try:
        service = RewardService(config.weights, [], build_scorers(config))
    except (ValueError, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    metadata = _metadata(metadata_file, len(images)) if metadata_file else None
    scores = service.score(loaded, prompts, [str(p) for p in images], metadata)
    rows = [("image", "prompt", *reward)]
    for i, path in enumerate(images):
        shown = prompts[i] if len(prompts[i]) <= 40 else prompts[i][:37] + "..."
        rows.append((str(path), shown, *(f"{scores[name][i]:.4f}" for name in reward)))
    echo_table(rows)


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
    """Load every reward RECIPE weights or guards and score a batch of placeholder images at its sampling size with
    the recipe's first prompts (and their metadata): the load time, the seconds per image and the scores' range, per
    reward. Exit 2 if one cannot load or score."""
    import numpy as np
    from PIL import Image

    from unirl_core.config import load_recipe
    from unirl_core.data.sources import build_source
    from unirl_core.rewards.registry import build_scorers
    from unirl_core.rewards.service import RewardService

    train = load_recipe(recipe, set_ or []).train
    config, sampling = train.reward, train.sampling
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (sampling.height, sampling.width, 3), dtype=np.uint8))
              for _ in range(batch)]  # fmt: skip
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
            service = RewardService(single.weights, [], build_scorers(single))
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
