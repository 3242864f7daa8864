"""Run every training round of a recipe in this process, without Prefect (for kill-and-resume tests).

python tests/support/train_rounds.py RECIPE OUTPUT_DIR [dotted.key=value ...]
"""

from __future__ import annotations

import sys

from unirl_core.config import load_recipe
from unirl_core.trainer import plan_rounds, run_round

if __name__ == "__main__":
    recipe, output_dir, precache_json, *overrides = sys.argv[1:]
    loaded = load_recipe(recipe, [f"train.output_dir={output_dir}", *overrides])
    precache = None
    if precache_json != "-":
        from pathlib import Path

        from unirl_core.config.precache import PrecacheConfig

        precache = PrecacheConfig.model_validate_json(Path(precache_json).read_text())
    for round_ in plan_rounds(loaded.train):
        summary = run_round(loaded.train, round_, run_name="resume-test", precache=precache)
        print(round_.name, "resumed from", summary.get("resumed_from"), flush=True)
