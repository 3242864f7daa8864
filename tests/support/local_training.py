"""Training rounds on one rank in the test's process: the `--local` transport of the one controller."""

from __future__ import annotations

from pathlib import Path

VOLATILE = ("seconds", "_per_s")  # timings


def on_one_rank(config, output_dir: Path, **ray):
    """`config` writing to `output_dir`, with one worker (and `ray` settings, e.g. cpus_per_worker=1)."""
    return config.model_copy(
        update={"output_dir": str(output_dir), "ray": config.ray.model_copy(update={"workers": 1, **ray})}
    )


def train_locally(config, output_dir: Path, on_step=None, **ray) -> list[dict]:
    """Every round of `config` in this process (no export); the metric rows logged, in order."""
    from unirl_core.controller import plan_rounds, run_round

    config = on_one_rank(config, output_dir, **ray)
    rows: list[dict] = []

    def logged(row: dict) -> None:
        rows.append(row)
        if on_step:
            on_step(row)

    for round_ in plan_rounds(config):
        run_round(config, round_, on_step=logged, local=True)
    return rows


def comparable(rows: list[dict]) -> list[dict]:
    """The rows without their timings: what must repeat bitwise."""
    return [{k: v for k, v in row.items() if not any(part in k for part in VOLATILE)} for row in rows]
