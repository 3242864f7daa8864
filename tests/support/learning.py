"""The learning claim of the tiny families: GRPO on the demo recipe, STEPS RL steps, raises jpeg_compressibility by
MARGIN over seeds 0-2 (the mean gain of the last WINDOW steps over the first WINDOW clears it and at least 2 of the 3
seeds do; see tests/integration/test_rl_learns.py). A family may ask for more steps (family_cases.LEARNING_STEPS)."""

from __future__ import annotations

from local_training import train_locally

from unirl_core.config import load_recipe

MARGIN = 0.05
WINDOW = 4
STEPS = 16  # the demo's 24 cost a third more; at 16 every family but FLUX.2-Klein clears the claim


def seeded(recipe: str, seed: int, steps: int, overrides=()):
    """`recipe`'s TrainConfig at `steps` RL steps, its sampling and data seeded with `seed`."""
    return load_recipe(
        recipe, [f"train.steps={steps}", *overrides, f"train.sampling.seed={seed}", f"train.data.seed={seed}"]
    ).train


def reward_gain(overrides: list[str], seed: int, output_dir, steps: int = STEPS,
                recipe: str = "demo") -> tuple[float, list[dict]]:  # fmt: skip
    metrics = train_locally(seeded(recipe, seed, steps, overrides), output_dir)
    rewards = [m["reward_mean"] for m in metrics]
    return sum(rewards[-WINDOW:]) / WINDOW - sum(rewards[:WINDOW]) / WINDOW, metrics


SEEDS = (0, 1, 2)


def gains_over_seeds(overrides: list[str], tmp_path, recipe: str = "demo") -> tuple[list[float], list[list[dict]]]:
    runs = [reward_gain(overrides, seed, tmp_path / f"seed{seed}", recipe=recipe) for seed in SEEDS]
    return [gain for gain, _ in runs], [metrics for _, metrics in runs]


def assert_learns(gains: list[float], runs: list[list[dict]]) -> None:
    rewards = {seed: [round(m["reward_mean"], 3) for m in metrics] for seed, metrics in zip(SEEDS, runs, strict=True)}
    message = f"gains {[round(g, 3) for g in gains]} for seeds {SEEDS}; rewards {rewards}"
    assert sum(gains) / len(gains) > MARGIN, message
    assert sum(gain > MARGIN for gain in gains) >= 2, message
