"""Domains by name: the recipe's `train.domain.name` -> a `Domain` subclass and its config.

domain_class("diffusion")               -> DiffusionDomain
domain_class("my_pkg.domains:MyDomain") -> a domain in any importable module (Ray workers import it too)
domain_config({"name": ..., ...})       -> its validated config (the class's `config_class`)
"""

from __future__ import annotations

from unirl_core.domains.base import Domain, DomainConfig
from unirl_core.plugins import named_class

BUILT_IN = {
    "diffusion": "unirl_core.domains.diffusion.domain:DiffusionDomain",
    "ar": "unirl_core.domains.ar.domain:ARDomain",
}


class UnknownDomainError(ValueError):
    """A domain name that is neither built in nor an importable `module:Class` Domain subclass."""


def domain_class(name: str) -> type[Domain]:
    return named_class(name, BUILT_IN, Domain, "domain", UnknownDomainError)


def domain_config(data: dict | DomainConfig | None = None) -> DomainConfig:
    """`data` validated by its domain's config class (`name` defaults to diffusion)."""
    if isinstance(data, DomainConfig):
        return data
    data = dict(data or {})
    return domain_class(data.get("name", "diffusion")).config_class.model_validate(data)


def section_class(section) -> type[DomainConfig]:
    """The config class of the domain a recipe's `train.domain` section names (for its error messages)."""
    try:
        return domain_class(section.get("name", "diffusion")).config_class
    except (AttributeError, ValueError):  # not a mapping, or an unknown name (reported on its own)
        return DomainConfig
