"""Classes and functions named by `package.module:Name`: how every registry (families, algorithms, samplers, domains,
rewards) loads a built-in or a user's code, with one error wording."""

from __future__ import annotations

import importlib


def load_object(target: str, what: str, error: type[Exception]):
    """What `target` ("module:Name") names; `what` names it in the `error` raised when it cannot be imported."""
    module, _, attribute = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise error(f"{what} cannot be imported ({exc})") from None


def load_class(target: str, base: type, what: str, error: type[Exception]) -> type:
    """The class `target` ("module:Class") names, checked to subclass `base`; `what` names it in the `error` raised
    otherwise (e.g. "model family 'x'")."""
    cls = load_object(target, what, error)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise error(f"{what} is not a subclass of {base.__module__}.{base.__qualname__}")
    return cls


def named_class(name: str, built_in: dict[str, str], base: type, kind: str, error: type[Exception]) -> type:
    """The `base` subclass a recipe's `name` means: a built-in (`built_in`: name -> "module:Class") or any importable
    "package.module:ClassName"; `kind` ("algorithm", "domain") names it in the `error` raised otherwise."""
    target = built_in.get(name) or (name if ":" in name else None)
    if target is None:
        article = "an" if base.__name__[0] in "AEIOU" else "a"
        raise error(
            f"{kind} {name!r} is unknown: choose one of {', '.join(built_in)}, or name {article} {base.__name__} "
            "subclass as 'package.module:ClassName'"
        )
    return load_class(target, base, f"{kind} {name!r}", error)
