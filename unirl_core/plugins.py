"""Classes named by `package.module:ClassName`: how every registry (families, algorithms, samplers) loads a built-in
or a user's class, with one error wording."""

from __future__ import annotations

import importlib


def load_class(target: str, base: type, what: str, error: type[Exception]) -> type:
    """The class `target` ("module:Class") names, checked to subclass `base`; `what` names it in the `error` raised
    otherwise (e.g. "model family 'x'")."""
    module, _, attribute = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise error(f"{what} cannot be imported ({exc})") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise error(f"{what} is not a subclass of {base.__module__}.{base.__qualname__}")
    return cls
