"""Typed recipes: models, loading with env interpolation and dotted overrides, resolved printing.

The names below load on first use (PEP 562), so that `unirl_core.config.schema_base` can be imported by the
modules the schema itself imports (each algorithm's config) without a circle through this package.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "RecipeError": "recipe",
    "RecipeIssue": "recipe",
    "dump_resolved": "recipe",
    "load_recipe": "recipe",
    "packaged_recipes": "recipe",
    "recipe_from_tree": "recipe",
    "DataConfig": "schema",
    "Recipe": "schema",
    "SamplingConfig": "schema",
    "TrainConfig": "schema",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
