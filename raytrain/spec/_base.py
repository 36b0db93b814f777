"""Shared pieces of the schema: strict and record models, field errors."""

from __future__ import annotations

import re
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class Strict(BaseModel):
    """A document section: unknown fields refused, and a true/false never read as a number
    (pydantic's lax mode takes `steps: true` as 1; a user who wrote it meant something else)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or admits_bool(field.annotation):
            return value
        items = value if isinstance(value, (list, tuple)) else (value,)
        if any(isinstance(item, bool) for item in items):
            raise ValueError(f"true/false ({value!r}) where this field takes a number or "
                             "text. To fix: write the value its description names")
        return value


def admits_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold true/false: bool, Any, a mapping (its own values
    are its own), a Literal with one, or a union, Annotated or sequence of such a type."""
    origin = typing.get_origin(annotation)
    if annotation is bool or annotation is Any or origin is dict:
        return True
    if origin is Literal:
        return any(isinstance(option, bool) for option in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType, typing.Annotated, list, tuple, set):
        return any(admits_bool(arg) for arg in typing.get_args(annotation))
    return False


def field_error(loc: tuple[str, ...], message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("invalid_combination", message), loc=loc, input=value
    )


def raise_if_any(title: str, errors: list[InitErrorDetails]) -> None:
    if errors:
        raise ValidationError.from_exception_data(title, errors)


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


def unused_fields(section: Strict, names: tuple[str, ...], kind_field: str
                  ) -> list[InitErrorDetails]:
    """Errors for fields set to something other than their default that mean nothing for the
    section's kind: a value that would be stored and shown but never used is refused, not
    silently kept. (A dumped spec carries every default, so defaults must pass.)"""
    kind = getattr(section, "kind")
    fields = type(section).model_fields
    return [field_error(
        (name,),
        f"{name} means nothing for {kind_field} {kind!r}. To fix: remove {name}, or choose "
        f"the kind that uses it",
        "(omitted)",
    ) for name in names if name in section.model_fields_set
        and getattr(section, name) != fields[name].get_default(call_default_factory=True)]


def factory_errors(needed: bool, factory: str | None) -> list[InitErrorDetails]:
    if needed and not factory:
        return [
            field_error(
                ("factory",),
                "kind 'import' needs a factory. To fix: set factory to 'package.module:callable'",
                factory,
            )
        ]
    if factory and not IMPORT_PATH.match(factory):
        return [
            field_error(
                ("factory",),
                f"{factory!r} is not an import path. To fix: write it as "
                "'package.module:callable'",
                factory,
            )
        ]
    return []
