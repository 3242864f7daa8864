"""RL algorithms by name: the recipe's `train.algorithm.name` -> an `Algorithm` subclass and its config.

    algorithm_class("grpo")                        -> GRPO (built-ins are imported on first use)
    algorithm_class("my_pkg.algos:MyAlgorithm")     -> an algorithm in any importable module (Ray workers import it)
    algorithm_config({"name": "mixgrpo", ...})      -> its validated config (MixGRPOConfig)
    build_algorithm(config)                         -> the algorithm object the train stack drives

Adding an algorithm: one module in `algorithms/` and its line in BUILT_IN (or no line: name it by `module:Class`).
This is the only place an algorithm's name is looked up; the loop reads capabilities, never names.
"""

from __future__ import annotations

from unirl_core.algorithms.base import Algorithm
from unirl_core.algorithms.config import AlgorithmConfig
from unirl_core.plugins import named_class

BUILT_IN = {
    "grpo": "unirl_core.algorithms.grpo:GRPO",
    "reinforce": "unirl_core.algorithms.reinforce:Reinforce",
    "flow_grpo_fast": "unirl_core.algorithms.flow_grpo_fast:FlowGRPOFast",
    "mixgrpo": "unirl_core.algorithms.mixgrpo:MixGRPO",
    "mixgrpo_flash": "unirl_core.algorithms.mixgrpo:MixGRPOFlash",
    "dancegrpo": "unirl_core.algorithms.dancegrpo:DanceGRPO",
    "grpo_guard": "unirl_core.algorithms.grpo_guard:GRPOGuard",
    "flow_dppo": "unirl_core.algorithms.flow_dppo:FlowDPPO",
    "diffusion_nft": "unirl_core.algorithms.diffusion_nft:DiffusionNFT",
    "token_grpo": "unirl_core.algorithms.token_grpo:TokenGRPO",
    "dapo": "unirl_core.algorithms.dapo:DAPO",
    "dr_grpo": "unirl_core.algorithms.dr_grpo:DrGRPO",
    "gspo": "unirl_core.algorithms.gspo:GSPO",
}


class UnknownAlgorithmError(ValueError):
    """An algorithm name that is neither built in nor an importable `module:Class` Algorithm subclass."""


def algorithm_class(name: str) -> type[Algorithm]:
    return named_class(name, BUILT_IN, Algorithm, "algorithm", UnknownAlgorithmError)


def builtin_configs() -> dict[str, type[AlgorithmConfig]]:
    """Each built-in algorithm's config class, by name (the members of the recipe's `train.algorithm` union)."""
    return {name: algorithm_class(name).config_class for name in BUILT_IN}


def algorithm_config(data: dict | AlgorithmConfig | None = None) -> AlgorithmConfig:
    """`data` validated by its algorithm's config class (`name` defaults to grpo): its defaults fill the rest."""
    if isinstance(data, AlgorithmConfig):
        return data
    data = dict(data or {})
    return algorithm_class(data.get("name", "grpo")).config_class.model_validate(data)


def build_algorithm(config: AlgorithmConfig) -> Algorithm:
    return algorithm_class(config.name)(config)
