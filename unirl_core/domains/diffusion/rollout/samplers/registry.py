"""Samplers by name: the recipe's `train.algorithm.sde_type` -> the `Sampler` a family's kind runs.

    sampler_for("cps", "flow")                -> CPS()
    sampler_for("sde", "ddim")                -> DDIM() (the recipe's `sde` is each kind's own stochastic step)
    sampler_for("my_pkg.samplers:Mine", kind) -> any importable Sampler subclass of that kind

Adding a sampler: one module here and its line in BUILT_IN, or no line: name it by `module:Class`.
"""

from __future__ import annotations

import functools

from unirl_core.domains.diffusion.rollout.samplers.base import Sampler
from unirl_core.errors import UserError
from unirl_core.plugins import load_class

BUILT_IN: dict[str, dict[str, str]] = {  # name -> {family kind: "module:Class"}
    "sde": {
        "flow": "unirl_core.domains.diffusion.rollout.samplers.flow_sde:FlowSDE",
        "ddim": "unirl_core.domains.diffusion.rollout.samplers.ddim:DDIM",
    },
    "cps": {"flow": "unirl_core.domains.diffusion.rollout.samplers.cps:CPS"},
    "dance": {"flow": "unirl_core.domains.diffusion.rollout.samplers.dance_sde:DanceSDE"},
}


class UnknownSamplerError(UserError, ValueError):
    """A sampler name that is neither built in nor an importable `module:Class` Sampler subclass."""


def sampler_classes(name: str) -> list[type[Sampler]]:
    """The classes `name` names: one per family kind for a built-in, the class itself for `module:Class`."""
    if name in BUILT_IN:
        return [_load(target, name) for target in BUILT_IN[name].values()]
    if ":" in name:
        return [_load(name, name)]
    raise UnknownSamplerError(
        f"sampler {name!r} is unknown: choose one of {', '.join(BUILT_IN)}, or name a Sampler subclass as "
        "'package.module:ClassName'"
    )


@functools.cache
def sampler_for(name: str, kind: str) -> Sampler:
    """The sampler `name` for a family of `kind` (`flow`, `ddim`); a UserError when it has none of that kind."""
    found = [cls for cls in sampler_classes(name) if cls.kind == kind]
    if not found:
        runs = sorted(n for n, kinds in BUILT_IN.items() if kind in kinds)
        raise UserError(f"sampler {name!r} does not apply to {kind} families; choose one of {', '.join(runs)}")
    return found[0]()


def _load(target: str, name: str) -> type[Sampler]:
    return load_class(target, Sampler, f"sampler {name!r}", UnknownSamplerError)
