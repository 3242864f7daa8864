"""The `unirl` command.

Commands that need no orchestration (validate, recipes, prompts show, tiny-models) call unirl_core directly;
commands that run flows (prompts check) go through Prefect. Heavy imports happen inside each command, so
`unirl --help` stays fast. Exit codes: 0 success, 2 bad input (the message says what and how to fix it): any
`UserError` a command raises becomes one `error: <message>` on stderr, in one place (`UserErrorsExit2`), as does an
OSError no retry can fix (disk full, read-only, no permission); 1 anything else, as one line naming the exception
and the log file holding its traceback (`--verbose` lets the traceback through). What the terminal shows and where
the libraries' logs go: flows/console.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException

from flows import console, interrupt
from flows.cli_bagel import bagel_app
from flows.cli_rewards import rewards_app
from flows.cli_tables import echo_table
from unirl_core.errors import UserError
from unirl_core.rewards.errors import ScorerUnavailableError

if TYPE_CHECKING:
    from unirl_core.summaries import IngestSummary

BAD_INPUT = 2


class UserErrorsExit2(TyperGroup):
    """The root command group: a `UserError` raised by any command (sub-commands included) is printed as
    `error: <message>` on stderr, without a traceback, and the exit code is 2. It wraps the click command itself,
    so the console script and typer's CliRunner both go through it."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=BAD_INPUT) from None
        except ScorerUnavailableError as exc:  # transient, retried by the tasks; once they gave up: one line, exit 1
            typer.echo(f"error: {exc}; check that it is up and reachable, then run the command again", err=True)
            raise typer.Exit(code=1) from None
        except BrokenPipeError:  # `unirl recipes | head`: the reader left; nothing more to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush must not fail
            raise typer.Exit(code=1) from None
        except OSError as exc:  # disk full, read-only, no permission: one line naming the path, no traceback
            from unirl_core.io.storage import PERMANENT_ERRNOS, is_permanent

            if not is_permanent(exc):
                return self._unexpected(exc)
            where = f"{exc.filename}: " if exc.filename else ""
            typer.echo(f"error: {where}{PERMANENT_ERRNOS[exc.errno]}", err=True)
            raise typer.Exit(code=BAD_INPUT) from None
        except (TyperException, typer.Exit, typer.Abort):  # usage errors, exits: click prints them
            raise
        except Exception as exc:
            return self._unexpected(exc)

    @staticmethod
    def _unexpected(exc: Exception):
        """Anything else (a bug, a crashed worker): one line and where its traceback is, exit 1; `--verbose`
        lets it escape with its traceback."""
        if console.verbose():
            raise exc
        typer.echo(console.error_line(exc), err=True)
        raise typer.Exit(code=1) from None


app = typer.Typer(
    cls=UserErrorsExit2,
    help="unirl: ingest image-text data, precache encodings and train image generators with GRPO.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",  # a docstring's paragraph is one paragraph (no line break mid-sentence)
)
prompts_app = typer.Typer(help="Inspect and check prompt files (.txt, .jsonl, .json).", no_args_is_help=True)
app.add_typer(prompts_app, name="prompts")
shards_app = typer.Typer(help="Inspect WebDataset shards written by `unirl ingest`.", no_args_is_help=True)
app.add_typer(shards_app, name="shards")
app.add_typer(bagel_app, name="bagel")
app.add_typer(rewards_app, name="rewards")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"unirl {version('unirl')}")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Every library's own log lines on the terminal, and tracebacks (UNIRL_VERBOSE=1)."
        ),
    ] = False,
) -> None:
    """unirl: ingest image-text data, precache encodings and train image generators with GRPO."""
    console.prepare(ctx.invoked_subcommand or "unirl", verbose)


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=BAD_INPUT)


@app.command()
def validate(
    recipe: Annotated[str, typer.Argument(help="Recipe file, or the name of a packaged recipe (see `unirl recipes`).")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Override a value: dotted.key=value (repeatable)."),
    ] = None,
) -> None:
    """Print the fully resolved recipe as YAML, or every error with its dotted path (exit 2), including what the
    `train` section alone shows cannot train (groups vs workers, image sizes, warm-up keys)."""
    from unirl_core.config import dump_resolved, load_recipe
    from unirl_core.controller.round_plan import TrainingConfigError, config_problems

    loaded = load_recipe(recipe, set_ or [])
    problems = config_problems(loaded.train, loaded.precache) if loaded.train else []
    if problems:
        raise TrainingConfigError("training cannot start:\n  " + "\n  ".join(problems))
    typer.echo(dump_resolved(loaded), nl=False)


_UNSET = "unset:"


def _named_unset(unset: set[str]):
    """For `load_recipe(unset=...)`: a variable neither set nor defaulted reads `unset:NAME` and is collected."""

    def value(name: str) -> str:
        unset.add(name)
        return f"{_UNSET}{name}"

    return value


@app.command()
def plan(
    recipe: Annotated[str, typer.Argument(help="A recipe with a `train` section (file or packaged name).")],
    variant: Annotated[
        str | None,
        typer.Option(help="Real model sizes to plan for (e.g. sd3.5-medium); default: train.model.path's configs."),
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value.")] = None,
) -> None:
    """Parameters and per-worker memory (rollout and training) of the recipe at its real model size, from the
    components' configs on the meta device: no weights, no GPU, seconds. Names the largest term."""
    from unirl_core.config import load_recipe
    from unirl_core.controller.memory import format_plan, memory_plan
    from unirl_core.models.real_sizes import VARIANTS, variant_names
    from unirl_core.models.registry import family_class, resolve_model_path

    unset: set[str] = set()
    loaded = load_recipe(recipe, set_ or [], unset=_named_unset(unset))  # the plan reads no data, rewards, weights
    if loaded.train is None:
        raise _fail(f"error: recipe {recipe} has no `train` section")
    config = loaded.train
    if config.domain.name == "ar":  # a causal LM: its config.json, not a diffusers pipeline
        from unirl_core.domains.ar.plan import lm_memory_plan, plan_source

        if variant is None and config.model.path.startswith(_UNSET):
            raise _fail(f"error: train.model.path comes from {config.model.path[len(_UNSET) :]}, which is not set: "
                        "set it to the model's folder or pass --variant, one of: qwen3-8b, qwen3-4b")  # fmt: skip
        try:
            source = plan_source(config, variant)
        except ValueError as exc:
            raise _fail(f"error: {exc}") from None
        _quiet_model_libraries()
        typer.echo(format_plan(lm_memory_plan(config, source)))
        if unset:
            typer.echo(f"not set, and not needed for the plan: {', '.join(sorted(unset))}")
        return
    family_class(config.model.family)  # an unknown family: one error line (UserError)
    if variant is not None:
        if variant not in VARIANTS:
            raise _fail(f"error: --variant {variant!r} is unknown; variants: {', '.join(variant_names())}")
        if VARIANTS[variant]["family"] != config.model.family:
            raise _fail(
                f"error: --variant {variant} is a {VARIANTS[variant]['family']} model but train.model.family is "
                f"{config.model.family}; variants of {config.model.family}: "
                f"{', '.join(variant_names(config.model.family)) or 'none'}"
            )
        source = variant
    elif config.model.path.startswith(_UNSET):
        raise _fail(
            f"error: train.model.path comes from {config.model.path[len(_UNSET) :]}, which is not set: set it to the "
            f"model's folder or pass --variant, one of: {', '.join(variant_names(config.model.family)) or 'none yet'}"
        )
    else:
        source = resolve_model_path(config.model.path)
        if not (Path(source) / "model_index.json").is_file():
            raise _fail(
                f"error: train.model.path {config.model.path!r} is not a local pipeline folder (model_index.json); "
                f"pass --variant, one of: {', '.join(variant_names(config.model.family)) or 'none yet'}"
            )
    _quiet_model_libraries()
    typer.echo(format_plan(memory_plan(config, source)))
    if unset:
        typer.echo(f"not set, and not needed for the plan: {', '.join(sorted(unset))}")


@app.command()
def schema() -> None:
    """Print the recipe's JSON Schema (for editor completion of recipe YAML files, and the Prefect form)."""
    from unirl_core.config import Recipe

    typer.echo(json.dumps(Recipe.model_json_schema(), indent=2))


@app.command()
def recipes() -> None:
    """List the recipes shipped with unirl (usable by name wherever a recipe file is expected)."""
    import yaml
    from rich.table import Table

    from unirl_core.config import packaged_recipes

    table = Table("recipe", "description", box=None, pad_edge=False, header_style="bold")
    for name, path in sorted(packaged_recipes().items()):
        table.add_row(name, (yaml.safe_load(path.read_text()) or {}).get("description", ""))
    console.stdout.print(table)  # the description wrapped at word boundaries to the terminal's width


@prompts_app.command("show")
def prompts_show(
    path: Annotated[str, typer.Argument(help="Prompt file: local path or fsspec URL (s3://...).")],
    limit: Annotated[int | None, typer.Option(help="Show at most N prompts.", min=0)] = None,
    samples_per_prompt: Annotated[
        int | None,
        typer.Option("--samples-per-prompt", "-k", help="Expand into rollout groups of K samples.", min=1),
    ] = None,
    prompt_key: Annotated[str, typer.Option(help="JSON key holding the prompt text.")] = "prompt",
) -> None:
    """Print the normalized prompts as JSON lines (a count goes to stderr)."""
    from unirl_core.data.grpo_groups import expand_groups
    from unirl_core.data.prompts import load_prompts

    try:
        examples = load_prompts(path, prompt_key=prompt_key)
    except OSError as exc:  # storage: unreachable endpoint, missing credentials, ...
        raise _fail(f"error: {path}: cannot read the prompt file ({exc})") from None
    total = len(examples)
    examples = examples[:limit] if limit is not None else examples
    rows = [e.to_dict() for e in examples]
    if samples_per_prompt:
        rows = [s.to_dict() for s in expand_groups(examples, samples_per_prompt)]
    for row in rows:
        sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
    shown = f"{len(examples)} of {total} prompts" if len(examples) != total else f"{total} prompts"
    expanded = f" x {samples_per_prompt} = {len(rows)} samples" if samples_per_prompt else ""
    typer.echo(f"{shown}{expanded} from {path}", err=True)


@prompts_app.command("check")
def prompts_check(
    paths: Annotated[list[str], typer.Argument(help="Prompt files to check (each becomes one Prefect task).")],
    prompt_key: Annotated[str, typer.Option(help="JSON key holding the prompt text.")] = "prompt",
) -> None:
    """Check many prompt files in a Prefect flow (one task per file); exit 2 if any is bad."""
    from flows.prompts import check_prompt_files

    reports = check_prompt_files(paths, prompt_key=prompt_key)
    for report in reports:
        status = f"{report['num_prompts']} prompts" if report["ok"] else f"error: {report['error']}"
        typer.echo(f"{report['path']}: {status}")
    if not all(r["ok"] for r in reports):
        raise typer.Exit(code=BAD_INPUT)


@app.command()
def ingest(
    recipe: Annotated[str, typer.Argument(help="Recipe file or packaged recipe name with an `ingest` section.")],
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value.")] = None,
) -> None:
    """Run the ingest flow (parquet -> WebDataset shards) with a progress bar, then print the summary."""
    from unirl_core.ingest.workers import head_start, prestart

    prestart()  # the workers' forkserver imports the ingest modules while this process reads the recipe
    config = _recipe_section(recipe, set_, "ingest")
    _refuse_missing_local_inputs(config)
    from tasks.progress import report

    # the plan and the first units start while Prefect is imported; their rows show at once
    with console.CommandProgress(), head_start(config, on_row=lambda n: report("rows", n)):
        from flows.ingest import ingest as ingest_flow

        summary = ingest_flow(config)
    _print_summary(summary)


def _refuse_missing_local_inputs(config) -> None:
    """A local input pattern that matches no file is refused before Prefect starts (remote ones are listed by the
    flow's plan task, which retries what a retry may fix)."""
    from unirl_core.ingest.plan import list_inputs
    from unirl_core.io import storage

    if config.download_parquet.enable:
        list_inputs([p for p in config.download_parquet.parquet_pattern if not storage.is_url(p)])


@app.command(context_settings={"allow_extra_args": False})
def precache(
    target: Annotated[str, typer.Argument(help="A recipe with a `precache` section, or the word `prompts`.")],
    prompts_file: Annotated[str | None, typer.Argument(help="With `prompts`: the prompt file to embed.")] = None,
    recipe: Annotated[str | None, typer.Option(help="With `prompts`: the recipe whose text encodings to use.")] = None,
    cache_dir: Annotated[
        str | None, typer.Option(help="With `prompts`: cache root (default $UNIRL_HOME/cache/text-embeddings).")
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value.")] = None,
) -> None:
    """`unirl precache RECIPE`: run the precache flow (shards -> encoding shards) and print the summary.
    `unirl precache prompts FILE --recipe R`: fill the text-embedding cache for a prompt file."""
    recipe_ref = recipe if target == "prompts" else target
    if recipe_ref is None or (target == "prompts" and prompts_file is None):
        raise _fail("error: usage: unirl precache RECIPE | unirl precache prompts PROMPTS_FILE --recipe RECIPE")
    if target == "prompts":
        _precache_prompts(_recipe(recipe_ref, set_), prompts_file, cache_dir)
        return
    config = _recipe_section(recipe_ref, set_, "precache")
    from flows.precache import precache as precache_flow

    with console.CommandProgress():
        summary = precache_flow(config)
    _print_table(f"precache: {summary.output}", summary.model_dump())


TRAIN_COLUMNS = {  # metric -> (header, format)
    "step": ("step", "{:>4d}"),
    "reward_mean": ("reward", "{:>9.4f}"),
    "reward_std": ("+-std", "{:>7.4f}"),
    "zero_std_ratio": ("zero_std", "{:>8.2f}"),
    "ratio_max": ("ratio_max", "{:>9.4f}"),
    "clip_fraction": ("clipped", "{:>7.3f}"),
    "approx_kl": ("approx_kl", "{:>9.2e}"),
    "grad_norm": ("grad_norm", "{:>9.2e}"),
    "lr": ("lr", "{:>8.2e}"),
    "images_per_s": ("img/s", "{:>6.1f}"),
}


@app.command()
def train(
    recipe: Annotated[str, typer.Argument(help="A recipe with a `train` section (file or packaged name).")],
    local: Annotated[
        bool,
        typer.Option("--local", help="One rank in this process: the same rounds without Ray or Prefect (MLflow kept)."),
    ] = False,
    steps: Annotated[int | None, typer.Option(help="RL steps (default: the recipe's train.steps).", min=1)] = None,
    device: Annotated[str, typer.Option(help="--local: cpu (all cores) or cuda (the current GPU).")] = "cpu",
    checkpoint_every: Annotated[
        int | None,
        typer.Option(
            help="Commit a checkpoint under <output_dir>/checkpoints every N steps (rounds also commit at their end).",
            min=0,
        ),
    ] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value.")] = None,
) -> None:
    """Train: warm-up and RL rounds on a Ray worker group (FSDP2) as a Prefect flow, checkpointed, resumable and
    tracked in MLflow; re-running after a failure resumes from the last committed checkpoint. `--local`: the same
    controller and rounds on one rank in this process (no Ray, no Prefect)."""
    overrides = _local_overrides(device) if local else []
    overrides += [f"train.steps={steps}"] if steps else []
    overrides += [f"train.checkpoint_every={checkpoint_every}"] if checkpoint_every is not None else []
    loaded = _recipe(recipe, [*overrides, *(set_ or [])])
    if loaded.train is None:
        raise _fail(f"error: recipe {recipe} has no `train` section")
    _quiet_model_libraries()
    _train_rounds(loaded, local)


def _local_overrides(device: str) -> list[str]:
    """One rank in this process: on the CPU with every core, or on the current GPU."""
    if device == "cpu":
        return ["train.ray.workers=1", f"train.ray.cpus_per_worker={os.cpu_count() or 1}"]
    if device == "cuda":
        return ["train.ray.workers=1", "train.ray.gpus_per_worker=1"]
    raise _fail(f"error: --device {device!r}: choose cpu or cuda (CUDA_VISIBLE_DEVICES picks the GPU)")


def _train_rounds(recipe, local: bool = False) -> None:
    from unirl_core.controller import plan_rounds, validate
    from unirl_core.domains.registry import domain_class
    from unirl_core.worker.metrics_summary import reward_trend

    config = recipe.train
    validate(config, recipe.precache)  # before any Prefect or Ray work
    rounds = plan_rounds(config)
    interrupt.keep(lambda: _kept_checkpoint(config))
    typer.echo(
        f"training {domain_class(config.domain.name).title(config)}: {len(rounds)} round{'' if len(rounds) == 1 else 's'} "
        f"({config.warmup.steps} warm-up + {config.steps} RL steps) on "
        f"{'1 rank in this process' if local else f'{config.ray.workers} workers'}, "
        f"{config.data.prompts_per_rollout} prompts x {config.sampling.samples_per_prompt} samples per step; "
        f"output {config.output_dir}"
    )
    rewards: list[float] = []
    with console.CommandProgress(train_steps=rounds[-1].end if rounds else 0, prefect=not local) as display:
        show = _step_rows(display, rewards, domain_class(config.domain.name).outputs_of(config))
        summary = _train_summary(recipe, local, show)
    for entry in summary.rounds:
        state = "already committed" if entry.skipped else f"{entry.seconds or 0:.1f} s"
        typer.echo(f"{entry.round}: steps {entry.first_step}-{entry.end_step - 1}, {state}")
    if len(rewards) >= 2:
        _print_reward_trend(reward_trend(rewards))
    for grid in [g for entry in summary.rounds for g in (entry.samples, entry.eval_samples) if g]:
        typer.echo(f"samples: {grid}")
    if summary.eval is not None and summary.eval.best_step is not None:
        found = summary.eval
        typer.echo(f"eval: {len(found.points)} points, best step {found.best_step} (eval/{found.best_metric} "
                   f"{found.best_value:.4f}); {len(found.breaches)} guard breach{'es' * (len(found.breaches) != 1)}")  # fmt: skip
    typer.echo(f"checkpoint: {summary.checkpoint}")
    typer.echo(f"exported: {summary.export}")
    typer.echo(f"registered model: {summary.registered_model} version {summary.model_version} (alias {summary.alias})")
    typer.echo(f"MLflow run: {summary.mlflow_run_url or summary.mlflow_run_id}")


def _kept_checkpoint(config) -> str:
    """What a stopped training run keeps: its last committed checkpoint (every commit is atomic)."""
    from unirl_core.controller.controller import checkpoints

    latest = checkpoints(config).latest()
    return f"kept checkpoint {latest.name} ({latest})" if latest else "no checkpoint committed yet"


def _step_rows(display: console.CommandProgress, rewards: list[float], outputs: str | None = "image"):
    """A listener printing one line per training step (the header before the first RL step), above the progress
    display; RL rewards are collected in `rewards` for the trend. `outputs`: the domain's (`text`: completions per
    second are headed `txt/s`, videos `vid/s`)."""
    headers = [header for header, _ in TRAIN_COLUMNS.values()]
    headers[-1] = {"text": "txt/s", "video": "vid/s"}.get(outputs, headers[-1])

    def show(kind: str, row) -> None:
        if kind == "train_eval":  # a `train.eval` point
            from unirl_core.controller.train_eval import eval_line

            display.line(f"  {eval_line(row)}")
        if kind != "train_step":
            return
        if row["stage"] == "warmup":
            display.line(f"  warm-up step {row['step']:>4}  loss {row['warmup_loss']:.4f}  lr {row['warmup_lr']:.2e}")
            return
        if not rewards:
            widths = [len(fmt.format(0)) for _, fmt in TRAIN_COLUMNS.values()]
            display.line("  " + "  ".join(f"{header:>{width}}" for header, width in zip(headers, widths, strict=True)))
        rewards.append(row["reward_mean"])
        cells = "  ".join(fmt.format(row.get(key, float("nan"))) for key, (_, fmt) in TRAIN_COLUMNS.items())
        display.line(f"  {cells}")

    return show


def _train_summary(recipe, local: bool, show):
    """The rounds in this process (`local`), or the train flow, with `show(kind, row)` called after every step."""
    name = recipe.name or "train"
    if local:
        from tasks.progress import report
        from unirl_core.controller import train_in_process

        def each_step(row: dict) -> None:
            report("train_step", row)  # the progress display
            show("train_step", row)

        return train_in_process(recipe.train, name, recipe.precache, on_step=each_step,
                                on_eval=lambda point: show("train_eval", point))  # fmt: skip
    from flows.train import train as train_flow
    from tasks.progress import add_listener, remove_listener

    add_listener(show)
    try:
        return train_flow(recipe.train, run_name=name, precache=recipe.precache)
    finally:
        remove_listener(show)


def _print_reward_trend(trend) -> None:
    window = trend.window
    typer.echo(
        f"reward: first {window} steps {trend.first:.4f} -> last {window} steps {trend.last:.4f} ({trend.change:+.4f})"
    )


@app.command()
def run(
    recipe: Annotated[str, typer.Argument(help="A recipe file or packaged name: its sections run in order.")],
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value.")] = None,
) -> None:
    """Run a recipe's sections in order (ingest -> precache -> train) as the `pipeline` flow; each stage resumes
    from its committed outputs, so a re-run after a failure redoes only what is missing."""
    _run_pipeline(_recipe(recipe, set_))


@app.command()
def demo(
    rows: Annotated[int, typer.Option(help="Good rows of the synthetic dataset (3 bad rows are added).", min=8)] = 64,
    family: Annotated[
        str, typer.Option(help="Model family of the tiny model trained (`unirl families` lists them).")
    ] = "sd3",
    video: Annotated[bool, typer.Option("--video", help="Video clips through the chain on the tiny Wan 2.1.")] = False,
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value.")] = None,
) -> None:
    """The whole pipeline on this machine's CPU: a synthetic dataset (procedural images + captions) -> ingest ->
    precache -> a supervised warm-up round -> 3 RL rounds on 2 Ray workers; prints what happened and where to look.
    `--family flux` runs the same chain on that family's tiny model (its VAE latents, its conditioning); `--video`
    runs `pipeline_video` on synthetic clips (plus bad ones) with the tiny Wan 2.1."""
    from unirl_core.data.synthetic import write_synthetic_parquet
    from unirl_core.workspace import workspace as current

    if video:
        _video_demo(current().ensure().root / "data" / "pipeline_video-source", rows, set_)
        return

    source = current().ensure().root / "data" / "pipeline_demo-source"
    overrides = demo_family_overrides(family)
    parquet = source / f"synthetic-{rows}.parquet"
    if not parquet.is_file():
        write_synthetic_parquet(str(parquet), rows=rows)
    os.environ.setdefault("INPUT_PARQUET", str(parquet))
    os.environ.setdefault("DATA_PATH", demo_prompts(family, source, rows))
    typer.echo(f"synthetic dataset: {parquet} ({rows} good rows + 3 bad ones)")
    named = [] if family == "sd3" else [f"name=pipeline_demo_{family}"]  # its own outputs and registered model
    _run_pipeline(_recipe("pipeline_demo", [*named, *overrides, *(set_ or [])]))


def _video_demo(source: Path, rows: int, set_: list[str] | None) -> None:
    """`pipeline_video` on `rows` synthetic clips (plus bad ones) and their captions as the RL prompts."""
    from unirl_core.data.synthetic_video import synthetic_video_prompts, write_synthetic_video_parquet
    from unirl_core.io.storage import write_bytes_atomic

    parquet, prompts = source / f"synthetic-video-{rows}.parquet", source / f"video-prompts-{rows}.txt"
    if not parquet.is_file():
        write_synthetic_video_parquet(str(parquet), rows=rows)
    if not prompts.is_file():
        write_bytes_atomic(str(prompts), "\n".join(synthetic_video_prompts(rows)).encode() + b"\n")
    os.environ.setdefault("INPUT_PARQUET", str(parquet))
    os.environ.setdefault("DATA_PATH", str(prompts))
    typer.echo(f"synthetic video dataset: {parquet} ({rows} good clips + bad ones)")
    _run_pipeline(_recipe("pipeline_video", set_))


def demo_prompts(family: str, folder: Path, rows: int) -> str:
    """The demo's training prompts: the dataset's captions, or for an edit family (`condition_mode` "reference")
    instructions with a condition image each."""
    from unirl_core.data.synthetic import synthetic_prompts, write_synthetic_edit_prompts
    from unirl_core.io.storage import write_bytes_atomic
    from unirl_core.models.registry import family_class

    if family_class(family).condition_mode == "reference":
        edits = folder / f"edit-prompts-{rows}.jsonl"
        return str(edits) if edits.is_file() else write_synthetic_edit_prompts(str(folder), rows=rows)
    prompts = folder / f"prompts-{rows}.txt"
    if not prompts.is_file():
        write_bytes_atomic(str(prompts), "\n".join(synthetic_prompts(rows)).encode() + b"\n")
    return str(prompts)


def demo_family_overrides(family: str) -> list[str]:
    """pipeline_demo on another tiny family: the model trained and both precache encoders switched to it. A family
    without text-only conditioning (its prompts are encoded with their images) precaches latents only and skips
    the warm-up."""
    from unirl_core.models.registry import UnknownFamilyError, family_class

    try:
        cls = family_class(family)
    except UnknownFamilyError as exc:
        raise _fail(f"error: --family: {exc}") from None
    model = [f"train.model.family={family}", f"train.model.path=tiny:{family}"]
    model += ["train.eval=null"] if cls.condition_mode == "reference" else []  # its prompt sets carry no images
    if not cls.text_only_conditioning:
        latents = ("{modality: image, extension: png, key: image_latent, precision: 32, encoder_config: "
                   f"{{cls: unirl_core.precache.encoders.PipelineImageEncoder, pretrained: 'tiny:{family}', "
                   f"family: {family}}}}}")  # fmt: skip
        return [*model, f"precache.encodings=[{latents}]", "train.warmup.steps=0"]
    overrides = model
    for index in (0, 1):  # the image latents, the prompt conditioning
        overrides += [f"precache.encodings.{index}.encoder_config.pretrained=tiny:{family}",
                      f"precache.encodings.{index}.encoder_config.family={family}"]  # fmt: skip
    return overrides


def _run_pipeline(recipe) -> None:
    if recipe.ingest is not None:
        _refuse_missing_local_inputs(recipe.ingest)
    from rich.markdown import Markdown

    from flows.pipeline import pipeline, report
    from tasks.progress import add_listener, remove_listener
    from unirl_core.controller import METRICS_FILE, output_dir, plan_rounds, validate
    from unirl_core.worker.metrics_summary import read_metrics, round_means

    train_steps = None
    if recipe.train is not None:
        validate(recipe.train, recipe.precache)  # before any Prefect or Ray work
        train_steps = plan_rounds(recipe.train)[-1].end if plan_rounds(recipe.train) else 0
    _quiet_model_libraries()
    _prestart_ingest_workers(recipe.ingest)
    with console.CommandProgress(train_steps=train_steps) as display:
        show = _step_rows(display, [])
        add_listener(show)
        try:
            summary = pipeline(recipe)
        finally:
            remove_listener(show)

    typer.echo("")
    table, _, rest = report(summary).partition("\n\n")
    console.stdout.print(Markdown(table))  # the stage table, drawn
    for line in rest.splitlines():  # where things are: whole paths, never cropped to the terminal's width
        typer.echo(line.removeprefix("- ").replace("`", ""))
    if recipe.train is None:
        return
    typer.echo("")
    for mean in round_means(read_metrics(output_dir(recipe.train) / METRICS_FILE)):
        what = "mean reward" if mean.stage == "rl" else "mean warm-up loss"
        typer.echo(f"{mean.stage} round {mean.index}: {what} {mean.mean:.4f} over {mean.steps} steps")
    samples = output_dir(recipe.train) / "samples"
    typer.echo(f"\nsample grids: {samples}")
    typer.echo(f"UIs: `make serve` (Prefect and MLflow on 127.0.0.1); MLflow tracking: {_tracking_uri()}")


def _tracking_uri() -> str:
    from unirl_core.tracking.mlflow_runs import tracking_uri

    return tracking_uri()


@app.command()
def serve(
    prefect_port: Annotated[int, typer.Option(help="Prefect server and UI port.")] = 4200,
    mlflow_port: Annotated[int, typer.Option(help="MLflow server and UI port.")] = 5000,
    worker: Annotated[bool, typer.Option(help="Also run a worker for the `unirl-process` pool.")] = True,
) -> None:
    """Start the Prefect server + UI, the MLflow server + UI (the workspace's sqlite and artifacts) and a worker, all
    bound to 127.0.0.1; print the URLs; Ctrl-C or SIGTERM stops everything."""
    from flows.serve import serve as run_servers

    try:
        run_servers(prefect_port, mlflow_port, worker, echo=typer.echo)
    except (RuntimeError, TimeoutError) as exc:
        raise _fail(f"error: {exc}") from None


@app.command(name="export")
def export_(
    checkpoint: Annotated[str, typer.Argument(help="A training output_dir, its checkpoints/ folder or a step folder.")],
    out: Annotated[str, typer.Argument(help="Folder to write (replaced).")],
    merged: Annotated[
        bool, typer.Option("--merged", help="A full diffusers pipeline with the LoRA merged, not a peft adapter.")
    ] = False,
) -> None:
    """Export a committed checkpoint: a peft adapter folder (`PeftModel.from_pretrained(denoiser, OUT)`), or with
    --merged the whole pipeline (`<Pipeline>.from_pretrained(OUT)`)."""
    _quiet_model_libraries()
    from unirl_core.worker.export import export_checkpoint

    written = export_checkpoint(checkpoint, out, merged=merged)
    typer.echo(f"exported {'merged pipeline' if merged else 'adapter'} to {written}")


@app.command(name="eval")
def eval_(
    model: Annotated[
        str,
        typer.Argument(
            help="A training output_dir or checkpoint, an export folder, or (with --recipe) a model folder."
        ),
    ],
    against: Annotated[
        str | None, typer.Option(help="A second model scored on the same prompts and noise: the paired differences.")
    ] = None,
    prompts: Annotated[
        str | None,
        typer.Option(
            help="Prompt file (.txt, .jsonl, .json) or a packaged set: geneval, ocr, aesthetic; default: the recipe's "
            "data.eval_data_path."
        ),
    ] = None,
    reward: Annotated[
        list[str] | None, typer.Option("--reward", "-r", help="A reward to score (repeat); default: the recipe's.")
    ] = None,
    recipe: Annotated[
        str | None, typer.Option(help="The recipe of a model folder (its family, sampling, reward settings).")
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Denoising steps (default: the recipe's eval steps).", min=1)
    ] = None,
    guidance: Annotated[
        float | None, typer.Option(help="Guidance scale (default: the recipe's eval guidance).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Noise seed (default: the recipe's sampling.seed).", min=0)] = None,
    shard_size: Annotated[int, typer.Option(help="Prompts per task (the unit a re-run skips).", min=1)] = 16,
    batch_size: Annotated[int, typer.Option(help="Images generated per forward pass.", min=1)] = 4,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    out: Annotated[str | None, typer.Option(help="Folder of the evaluation (default: $UNIRL_HOME/eval/<key>).")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="Override of --recipe: dotted.key=value.")
    ] = None,
) -> None:
    """Score a model on a prompt set: images with fixed noise per prompt, every reward's mean with a bootstrap 95 %
    interval; with --against, both models on the same prompts and noise and the paired differences. A Prefect
    flow of one task per shard; a re-run scores only the shards not yet committed."""
    recipe_train = None
    if set_ and recipe is None:
        raise _fail("error: --set overrides the --recipe's keys; pass --recipe RECIPE with it")
    if recipe is not None:
        recipe_train = _recipe(recipe, set_).train
        if recipe_train is None:
            raise _fail(f"error: recipe {recipe} has no `train` section")
    _quiet_model_libraries()
    from unirl_core.evaluation.run import build_spec, check_folder

    spec = build_spec(model, against, recipe_train, prompts, reward, steps, guidance, seed, shard_size, batch_size,
                      out, device)  # fmt: skip
    check_folder(spec)  # before Prefect starts
    from flows.evaluate import evaluate, table_rows

    interrupt.keep(lambda: _kept_shards(spec))
    how = (f"{spec.steps} steps, guidance {spec.guidance:g}, {spec.width}x{spec.height}"
           if spec.models[0].config.domain.name == "diffusion" else "completions")  # fmt: skip
    typer.echo(f"evaluating {', '.join(m.ref for m in spec.models)} on {spec.prompts} ({how}, seed {spec.seed}); "
               f"output {spec.output_dir}")  # fmt: skip
    with console.CommandProgress():
        result = evaluate(spec)
    _print_rows(f"eval: {result.prompts} prompts", table_rows(result))
    for label, entry in zip(spec.labels(), spec.models, strict=True):
        step = f", step {entry.step}" if entry.step is not None else ""
        version = f", version {entry.version}" if entry.version else ""
        typer.echo(f"{label}: {entry.ref} ({entry.kind}{version}{step})")
    typer.echo(f"per-prompt scores: {Path(spec.output_dir) / 'results.parquet'}")


@app.command()
def promote(
    recipe: Annotated[str, typer.Argument(help="A recipe with a `promote` section (file or packaged name).")],
    set_: Annotated[list[str] | None, typer.Option("--set", "-s", help="Override: dotted.key=value.")] = None,
) -> None:
    """The promotion gate by hand: the registered model's candidate version against its champion on the section's
    prompts and gate metrics; it becomes champion only when it wins on every one (the first version becomes
    champion); the decision and its reason go on the version in MLflow."""
    loaded = _recipe(recipe, set_)
    if loaded.promote is None:
        raise _fail(f"error: recipe {recipe} has no `promote` section")
    _quiet_model_libraries()
    from flows.promote import model_name_of
    from flows.promote import promote as promote_flow

    with console.CommandProgress():
        decided = promote_flow(loaded.promote, model_name_of(loaded), loaded.train)
    if decided.gate:
        rows = [{"gate metric": r.reward, "difference": f"{r.mean:+.4f}", "95% interval": f"[{r.low:+.4f}, "
                 f"{r.high:+.4f}]", "margin": f"{r.margin:g}", "won": "yes" if r.passed else "no"}
                for r in decided.gate]  # fmt: skip
        _print_rows(f"{decided.model_name}: version {decided.candidate} - version {decided.champion_before}", rows)
    verdict = "is the champion" if decided.promoted else "stays candidate"
    typer.echo(f"{decided.model_name} version {decided.candidate} {verdict}: {decided.reason}")


def _kept_shards(spec) -> str:
    count = spec.count()
    total = len(spec.shards(count)) * len(spec.labels())
    done = sum(1 for label in spec.labels() for shard in range(len(spec.shards(count)))
               if spec.shard_file(label, shard).is_file())  # fmt: skip
    return f"kept {done} of {total} scored shards ({spec.output_dir})"


def _print_rows(title: str, rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in rows[0]:
        table.add_column(column, justify="left" if column in ("reward", "model") else "right")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    Console().print(table)


def _precache_prompts(recipe, prompts_file: str, cache_dir: str | None) -> None:
    """Fill the text-embedding cache for every prompt of a file: the precache section's text encodings, and the
    train section's model conditioning (what `train.model.text_embedding_cache` reads)."""
    from unirl_core.data.prompts import PromptDataError, load_prompts
    from unirl_core.workspace import workspace as current

    config, train = recipe.precache, recipe.train
    specs = [e for e in config.encodings if e.modality == "text"] if config else []
    if not specs and train is None:
        raise _fail("error: the recipe has neither precache text encodings nor a train section to cache prompts for")
    try:
        prompts = sorted({e.prompt for e in load_prompts(prompts_file)})
    except PromptDataError as exc:
        raise _fail(f"error: {exc}") from None
    from unirl_core.precache.prompt_cache import fill_prompt_caches

    root = cache_dir or str(current().root / "cache" / "text-embeddings")
    model_root = cache_dir or (train.model.text_embedding_cache if train else None) or root
    _quiet_model_libraries()
    for fill in fill_prompt_caches(config, train, prompts, root, model_root):
        typer.echo(
            f"{fill.label}: {fill.texts} {'texts' if fill.label.startswith('train.') else 'prompts'}, {fill.hits} "
            f"cached already, {fill.misses} computed -> {fill.folder}"
        )


def _print_table(title: str, values: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    for key, value in values.items():
        table.add_row(key, str(value))
    Console().print(table)


def _recipe(recipe: str, overrides: list[str] | None):
    """The whole typed recipe (a RecipeError names every problem)."""
    from unirl_core.config import load_recipe

    return load_recipe(recipe, overrides or [])


def _recipe_section(recipe: str, overrides: list[str] | None, section: str):
    """The typed `section` of a recipe, or exit 2 naming the missing section (a RecipeError names every problem)."""
    config = getattr(_recipe(recipe, overrides), section)
    if config is None:
        raise _fail(f"error: recipe {recipe} has no `{section}` section")
    return config


def _prestart_ingest_workers(config) -> None:
    """Start the ingest workers' forkserver now, when the ingest will download: it imports the ingest modules
    while this process imports Prefect (~0.5 s sooner to the first image)."""
    if config is not None and config.download_images.enable:
        from unirl_core.ingest.workers import prestart

        prestart()


def _print_summary(summary: IngestSummary) -> None:
    """The ingest summary (an IngestSummary) as a table; stages that did not run (None) are left out."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"ingest: {summary.dataset}", show_header=False)
    for key, value in summary.model_dump(exclude={"dataset", "skip_reasons"}, exclude_none=True).items():
        table.add_row(key, str(value))
    for reason, count in summary.skip_reasons.items():
        table.add_row(f"skipped: {reason}", str(count))
    Console().print(table)


@shards_app.command("inspect")
def shards_inspect(
    path: Annotated[str, typer.Argument(help="Dataset root, its shards/ folder, or an index.json (local or s3://).")],
    samples: Annotated[int, typer.Option(help="Also print N sample records.", min=0)] = 0,
) -> None:
    """Print the shard index (complete and incomplete shards, samples, bytes, skip reasons) and N samples, as JSON
    lines."""
    from unirl_core.ingest.inspect import describe, sample_records

    summary = describe(path)
    sys.stdout.write(json.dumps(summary, ensure_ascii=False) + "\n")
    for record in sample_records(summary["shards_folder"], summary["shard_names"], samples):
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")


@app.command()
def families() -> None:
    """List the model families `train.model.family` accepts: the diffusers pipeline each loads, what it trains,
    whether it makes images or videos, how it is sampled and guided, and how a condition image enters."""
    from unirl_core.models.registry import family_class, family_names

    modes = {"start": "image-to-image", "reference": "edit (reference image)", "none": "-"}
    rows = [("family", "pipeline", "denoiser", "outputs", "sampler", "guidance", "condition image")]
    for name in family_names():
        cls = family_class(name)
        rows.append((name, cls.pipeline_class, cls.denoiser_name, cls.outputs, cls.sampler, cls.guidance,
                     modes.get(cls.condition_mode, cls.condition_mode)))  # fmt: skip
    echo_table(rows)


@app.command("tiny-models")
def tiny_models(
    out_dir: Annotated[Path, typer.Argument(help="New folder for the diffusers pipeline.")],
    family: Annotated[str, typer.Option(help="Model family (`unirl families` lists them).")] = "sd3",
    seed: Annotated[int, typer.Option(help="Seed of the random weights (same seed, same files).")] = 0,
) -> None:
    """Write a tiny diffusers pipeline folder (real architecture, random weights) for tests and demos."""
    from unirl_core.models.registry import UnknownFamilyError, write_tiny_model

    _quiet_model_libraries()
    try:
        out = write_tiny_model(out_dir, family, seed)
    except (FileExistsError, UnknownFamilyError) as exc:
        raise _fail(f"error: {exc}") from None
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    typer.echo(f"wrote tiny {family} pipeline (seed {seed}, {size / 1e6:.1f} MB) to {out}")


def _quiet_model_libraries() -> None:
    from unirl_core.models.logs import quiet_model_libraries

    quiet_model_libraries()


@app.command()
def workspace() -> None:
    """Show the workspace folder (UNIRL_HOME) and the embedded defaults it holds."""
    from unirl_core.tracking.mlflow_runs import tracking_uri
    from unirl_core.workspace import workspace as current

    ws = current()
    typer.echo(f"workspace     {ws.root}  (UNIRL_HOME)")
    typer.echo(f"mlflow        {tracking_uri()}")
    typer.echo(f"artifacts     {ws.mlflow_artifacts}")
    typer.echo(f"data          {ws.data}")
    typer.echo(f"outputs       {ws.outputs}")
    typer.echo(f"checkpoints   {ws.checkpoints}")


if __name__ == "__main__":
    app()
