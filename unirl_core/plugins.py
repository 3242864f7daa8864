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
