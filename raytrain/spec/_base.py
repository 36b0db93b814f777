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
