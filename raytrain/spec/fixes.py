"""How to fix a field that validation refused, said the same way by the service, the client,
the CLI and the dashboard.

pydantic says what is wrong ("Extra inputs are not permitted"); this adds what to do about
it, and for a misspelt name, the name that was probably meant (the closest field of the
model at that place in the document):

    fix_for({"type": "extra_forbidden", "loc": ("training", "learning_rat")}, JobSpec)
    # "remove it, or did you mean learning_rate?"
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Sequence

from pydantic import BaseModel

_FIXES = {
    "missing": "add it",
    "extra_forbidden": "remove it (a misspelt name?)",
    "json_invalid": "send the body as JSON",
    "string_pattern_mismatch": "send it in the form the API document gives",
}
_KINDS = {"int": "a whole number", "float": "a number", "bool": "true or false",
          "string": "a string", "list": "a list", "dict": "an object", "model": "an object"}


def fix_for(error: dict[str, Any], model: type[BaseModel] | None = None,
            skip: int = 0) -> str:
    """How to fix `error` (one of a pydantic ValidationError's `errors()`), for a document
    of `model`; `skip`: leading parts of its `loc` that are not in the document (FastAPI's
    "body")."""
    kind = error.get("type", "")
    loc = tuple(error.get("loc", ()))[skip:]
    if kind == "extra_forbidden" and model is not None and loc:
        meant = nearest_field(model, loc)
        if meant is not None:
            return f"remove it, or did you mean {meant}?"
    if kind in ("literal_error", "enum"):  # one of a few words: the one probably meant
        allowed = _allowed_words(error)
        close = difflib.get_close_matches(str(error.get("input")), allowed, n=1, cutoff=0.6)
        if close:
            return f"did you mean {close[0]!r}?"
    if kind in _FIXES:
        return _FIXES[kind]
    if kind.endswith(("_parsing", "_type")):
        return f"send {_KINDS.get(kind.split('_')[0], 'the type /openapi.json gives')} here"
    where = ".".join(str(part) for part in loc) or "the value"
    return f"change {where} to meet that"


def _allowed_words(error: dict[str, Any]) -> list[str]:
    """The values a literal or enum error allows, from its context ("'a', 'b' or 'c'")."""
    expected = str((error.get("ctx") or {}).get("expected", ""))
    return [word.strip(" '\"") for part in expected.split(" or ") for word in part.split(",")
            if word.strip(" '\"")]


def with_fix(error: dict[str, Any], model: type[BaseModel] | None = None,
             skip: int = 0) -> str:
    """The error's message, ending with how to fix it (kept when it already says)."""
    message = error.get("msg", "invalid")
    return message if "To fix" in message else \
        f"{message}. To fix: {fix_for(error, model, skip)}"


def nearest_field(model: type[BaseModel], loc: Sequence[Any]) -> str | None:
    """The field of the model at `loc[:-1]` whose name is closest to `loc[-1]`, if any is
    close."""
    here: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an index into a list: the same model
        fields = getattr(here, "model_fields", None)
        if fields is None or part not in fields:
            return None
        here = _model_in(fields[part].annotation)
        if here is None:
            return None
    names = list(getattr(here, "model_fields", {}))
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    return close[0] if close else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (itself, optional, or in a list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, tuple,
                                         typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
