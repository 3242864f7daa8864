"""The BAGEL export flow: an ingested dataset (or an edit-trajectory JSONL) -> BAGEL's raw data format, with its
`dataset_info` entry published as an artifact. Deployed as `bagel-export`, it also runs whenever ingest commits
new data (the `unirl.dataset.updated` event names the dataset)."""

from __future__ import annotations

from typing import Any, Literal

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.engine import flow
from tasks.bagel import export_task


def default_out_dir(source: str, kind: str) -> str:
    """Next to the source: `<dataset>-bagel/<kind>` (an edit JSONL: `<file stem>-bagel/edit`)."""
    base = source.rstrip("/")
    if kind == "edit" and base.endswith(".jsonl"):
        base = base[: -len(".jsonl")]
    return f"{base}-bagel/{kind}"


@flow(name="bagel-export", log_prints=True)
def bagel_export(
    source: str,
    kind: Literal["t2i", "vlm", "edit"] = "t2i",
    out_dir: str | None = None,
    rows_per_file: int | None = None,
    rows_per_row_group: int | None = None,
    caption_keys: list[str] | None = None,
    prompt: str = "Describe the image.",
    target: Literal["bagel", "unirl"] = "bagel",
    dataset_name: str | None = None,
) -> dict[str, Any]:
    """Export `source` as BAGEL `t2i_pretrain` parquet, `vlm_sft` JSONL + images, or `unified_edit` parquet (from a
    JSONL of trajectories). A re-run rewrites the same bytes; `dataset_info.json` is written last."""
    out_dir = out_dir or default_out_dir(source, kind)
    if kind == "vlm":
        options: dict[str, Any] = {"prompt": prompt}
    else:
        rows = rows_per_file or (4096 if kind == "t2i" else 1024)
        group = rows_per_row_group or min(256 if kind == "t2i" else 64, rows)
        options = {"rows_per_file": rows, "rows_per_row_group": group}
        if kind == "t2i":
            options["caption_keys"] = tuple(caption_keys or ("txt", "captions"))
    options |= {"target": target, "dataset_name": dataset_name}
    summary = export_task(kind, source, out_dir, options)
    table = [{"metric": k, "value": str(summary[k])} for k in ("format", "out_dir", "files", "samples")]
    table += [{"metric": f"skipped: {reason}", "value": str(n)} for reason, n in summary["skipped"].items()]
    create_table_artifact(table=table, key="bagel-export-summary", description=f"BAGEL {kind} export of {source}")
    entry = "\n".join(f"    {key!r}: {value!r}," for key, value in summary["dataset_info"].items())
    create_markdown_artifact(
        markdown=f"BAGEL `{summary['format']}` dataset info (target {summary['target']}: paste under "
        f"`DATASET_INFO[{summary['format']!r}][{summary['dataset_name']!r}]` in BAGEL's `data/dataset_info.py`, or "
        f"under `dataset_info:` in a unirl mixture):\n\n```python\n{{\n{entry}\n}}\n```\n\nIts group for BAGEL's "
        f"`--dataset_config_file`: `{summary['bagel_data']}`.",
        key="bagel-dataset-info",
        description=f"dataset_info for {out_dir}",
    )
    print(f"BAGEL {summary['format']}: {summary['samples']} samples in {out_dir}, skipped {summary['skipped']}")
    return summary
