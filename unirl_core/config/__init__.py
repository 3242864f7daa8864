"""Typed recipes: models, loading with env interpolation and dotted overrides, resolved printing."""

from unirl_core.config.recipe import (
    RecipeError,
    RecipeIssue,
    dump_resolved,
    load_recipe,
    packaged_recipes,
    recipe_from_tree,
)
from unirl_core.config.schema import DataConfig, Recipe, SamplingConfig, TrainConfig

__all__ = [
    "DataConfig",
    "Recipe",
    "RecipeError",
    "RecipeIssue",
    "SamplingConfig",
    "TrainConfig",
    "dump_resolved",
    "load_recipe",
    "packaged_recipes",
    "recipe_from_tree",
]
