"""`unirl bagel ...`: BAGEL-format data (t2i_pretrain, unified_edit, vlm_sft): demo data, exports from ingested
shards, and packing statistics of a mixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from unirl_core.errors import UserError

BAD_INPUT = 2

bagel_app = typer.Typer(
    help="BAGEL-format data: exports from ingested shards, a demo mixture, packing statistics.", no_args_is_help=True
)
export_app = typer.Typer(help="Write BAGEL's raw formats from this project's data.", no_args_is_help=True)
bagel_app.add_typer(export_app, name="export")


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code=BAD_INPUT)


def _demo_folder() -> Path:
    from unirl_core.workspace import workspace

    return workspace().ensure().root / "data" / "bagel-demo"


@bagel_app.command("demo-data")
def demo_data(
    out: Annotated[str | None, typer.Argument(help="Folder to write (default: $UNIRL_HOME/data/bagel-demo).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic pictures and captions.")] = 0,
) -> None:
    """Write a small BAGEL mixture: t2i parquet, edit parquet, VLM JSONL + images (+ a video with PyAV), a tiny
    tokenizer and mixture.yaml (its dataset_info, tokenizer and scaled-down packing settings)."""
    from unirl_core.data.bagel.demo import write_demo_mixture

    path = write_demo_mixture(Path(out) if out else _demo_folder(), seed=seed)
    typer.echo(f"wrote {path}\nnext: unirl bagel pack-stats {path}")


@bagel_app.command("pack-stats")
def pack_stats(
    config: Annotated[str, typer.Argument(help="A BAGEL data YAML (groups + dataset_info), or `demo`.")],
    packs: Annotated[int, typer.Option(help="Packs to build.", min=1)] = 20,
    dataset_info: Annotated[
        str | None, typer.Option(help="YAML/JSON with BAGEL's dataset info (instead of the config's `dataset_info`).")
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer folder (instead of the config's `tokenizer`).")
    ] = None,
    world_size: Annotated[int, typer.Option(help="Data-parallel ranks to shard for.", min=1)] = 1,
    rank: Annotated[int, typer.Option(help="The rank whose packs to build.", min=0)] = 0,
    num_workers: Annotated[int, typer.Option(help="DataLoader workers per rank to shard for.", min=1)] = 1,
    worker: Annotated[int, typer.Option(help="The worker whose packs to build.", min=0)] = 0,
    target: Annotated[
        str | None,
        typer.Option(help="Pack for `bagel` (BAGEL's trainer) or `unirl` (instead of the config's `target`)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the statistics as one JSON object.")] = False,
) -> None:
    """Pack N packs of one (rank, worker) and print which trainer they are packed for (the config's `target`),
    tokens per pack, fill ratio vs the target, samples per pack by dataset and skipped samples by dataset and
    reason."""
    from unirl_core.data.bagel.config import load_mixture
    from unirl_core.data.bagel.datasets import Layout
    from unirl_core.data.bagel.loader import pack_stats as collect
    from unirl_core.data.bagel.loader import resolve_config
    from unirl_core.data.bagel.transforms import TARGETS

    if rank >= world_size or worker >= num_workers:
        raise _fail(
            f"--rank {rank} / --worker {worker} must be below --world-size {world_size} / --num-workers {num_workers}"
        )
    try:
        if target is not None and target not in TARGETS:
            raise ValueError(f"--target {target!r}: use bagel or unirl")
        mixture = load_mixture(resolve_config(config, _demo_folder()), dataset_info, target)
        if tokenizer:
            mixture.tokenizer = tokenizer
        stats = collect(mixture, packs, Layout(rank, world_size, num_workers, mixture.seed), worker)
    except UserError:
        raise  # a BagelConfigError: `error: BAGEL data config ...`, one line per problem (the app prints it)
    except (ValueError, FileNotFoundError) as error:
        raise _fail(f"pack-stats {config}: {error}") from error
    if as_json:
        typer.echo(json.dumps(stats, indent=1))
        return
    _print_stats(config, stats)


def _print_stats(config: str, stats: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"packing: {config}", show_header=False)
    table.add_row("packed for", {"bagel": "bagel (BAGEL's trainer)", "unirl": "unirl"}[stats["packed_for"]])
    table.add_row("packs", str(stats["packs"]))
    table.add_row(
        "tokens per pack", f"{stats['tokens_per_pack']:.0f} (target {stats['target']}, hard cap {stats['hard_cap']})"
    )
    table.add_row(
        "fill ratio vs target",
        f"mean {stats['fill_ratio']:.3f}, min {stats['min_fill_ratio']:.3f}, max {stats['max_fill_ratio']:.3f}",
    )
    table.add_row("samples/s", f"{stats['samples_per_second']:.1f} ({stats['seconds']:.1f} s)")
    console.print(table)
    per = Table(title="samples per pack by dataset")
    per.add_column("dataset")
    per.add_column("samples per pack", justify="right")
    for name, count in stats["samples_per_pack"].items():
        per.add_row(name, f"{count:.2f}")
    console.print(per)
    skipped = Table(title="skipped samples by dataset and reason")
    for column in ("dataset", "reason", "samples"):
        skipped.add_column(column)
    rows = [(name, reason, n) for name, reasons in stats["skipped"].items() for reason, n in reasons.items()]
    for name, reason, n in rows or [("-", "none", 0)]:
        skipped.add_row(name, reason, str(n))
    console.print(skipped)


TargetOption = Annotated[
    str,
    typer.Option(help="bagel: entries and a bagel_data.yaml group BAGEL's trainer accepts as written; unirl: ours."),
]
NameOption = Annotated[
    str | None, typer.Option(help="Dataset name in bagel_data.yaml (default: the output folder's name).")
]


def _report(summary: dict) -> None:
    keys = ("format", "target", "samples", "skipped", "dataset_info", "bagel_data")
    typer.echo(json.dumps({k: summary[k] for k in keys}, indent=1))


@export_app.command("t2i")
def export_t2i(
    shards: Annotated[str, typer.Argument(help="An ingested dataset root, its shards/ folder, or a .tar (or URL).")],
    out: Annotated[
        str, typer.Argument(help="Output folder for the parquet files, parquet_info.json, dataset_info.json.")
    ],
    rows_per_file: Annotated[int, typer.Option(min=1)] = 4096,
    rows_per_row_group: Annotated[int | None, typer.Option(min=1, help="Default: min(256, rows per file).")] = None,
    caption_key: Annotated[
        list[str] | None, typer.Option(help="Members holding captions: `txt` and/or keys of the .json (repeatable).")
    ] = None,
    target: TargetOption = "bagel",
    dataset_name: NameOption = None,
) -> None:
    """t2i_pretrain parquet (`image` bytes, `captions` JSON dict) with parquet_info keyed by the real paths."""
    from unirl_core.data.bagel import export

    keys = tuple(caption_key) if caption_key else ("txt", "captions")
    _run_export(lambda: export.export_t2i(shards, out, rows_per_file=rows_per_file,
                                          rows_per_row_group=rows_per_row_group or min(256, rows_per_file), caption_keys=keys,
                                          target=target, dataset_name=dataset_name))  # fmt: skip


@export_app.command("edit")
def export_edit(
    source: Annotated[str, typer.Argument(help="JSONL of {images: [paths], instructions: [[options], ...]}.")],
    out: Annotated[str, typer.Argument(help="Output folder.")],
    rows_per_file: Annotated[int, typer.Option(min=1)] = 1024,
    rows_per_row_group: Annotated[int | None, typer.Option(min=1, help="Default: min(64, rows per file).")] = None,
    target: TargetOption = "bagel",
    dataset_name: NameOption = None,
) -> None:
    """unified_edit parquet (`image_list`, `instruction_list`) with parquet_info keyed by the real paths."""
    from unirl_core.data.bagel import export

    _run_export(lambda: export.export_edit(source, out, rows_per_file=rows_per_file,
                                           rows_per_row_group=rows_per_row_group or min(64, rows_per_file),
                                           target=target, dataset_name=dataset_name))  # fmt: skip


@export_app.command("vlm")
def export_vlm(
    shards: Annotated[str, typer.Argument(help="An ingested dataset root, its shards/ folder, or a .tar (or URL).")],
    out: Annotated[str, typer.Argument(help="Output folder for data.jsonl and images/.")],
    prompt: Annotated[str, typer.Option(help="The human turn after the <image> placeholder.")] = "Describe the image.",
    target: TargetOption = "bagel",
    dataset_name: NameOption = None,
) -> None:
    """vlm_sft JSONL (a captioning conversation per sample) + image folder."""
    from unirl_core.data.bagel import export

    _run_export(lambda: export.export_vlm(shards, out, prompt=prompt, target=target, dataset_name=dataset_name))


def _run_export(call) -> None:
    try:
        summary = call()
    except (ValueError, FileNotFoundError) as error:
        raise _fail(str(error)) from error
    _report(summary)
