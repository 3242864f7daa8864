"""The base of every config model: strict keys, validated assignment, documented fields."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

Problem = tuple[str, Any, str]  # (dotted path relative to the model, offending value, what is allowed)


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # YAML `true` would otherwise become the integer 1
        raise ValueError("a number is required, not true/false")
    return value


def _empty_is_unset(value: Any) -> Any:
    return None if value == "" else value


Count = Annotated[int, BeforeValidator(_not_bool)]
Seed = Annotated[int, BeforeValidator(_not_bool), Field(ge=0, lt=2**63)]
OptionalStr = Annotated[str | None, BeforeValidator(_empty_is_unset)]  # "" (an unset `${env:VAR,}`) counts as unset


@dataclass(frozen=True)
class SectionClass:
    """Field metadata: `pick(section)` -> the config class of a section whose `name` picks it (`train.domain`), for
    the recipe's error messages (allowed keys, "did you mean")."""

    pick: Callable[[Any], type]


class StrictModel(BaseModel):
    """Base of every config model: unknown keys refused, assignments validated, field docstrings documented."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True, allow_inf_nan=False
    )

    def problems(self) -> Iterator[Problem]:
        """Cross-field checks a single field's type cannot express. Paths are relative to this model."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, StrictModel):
                for path, bad, message in value.problems():
                    yield f"{name}.{path}", bad, message
