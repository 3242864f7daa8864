"""Plain aligned text tables for `unirl` commands whose output users read and scripts split on whitespace."""

from __future__ import annotations

import typer


def echo_table(rows: list[tuple[str, ...]]) -> None:
    """Print `rows` (the first one is the header) as left-aligned columns two spaces apart."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
