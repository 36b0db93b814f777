"""Shared pieces of the schema: strict and record models, field errors."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def field_error(loc: tuple[str, ...], message: str, value: Any) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError("invalid_combination", message), loc=loc, input=value
    )


def raise_if_any(title: str, errors: list[InitErrorDetails]) -> None:
    if errors:
        raise ValidationError.from_exception_data(title, errors)


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")
