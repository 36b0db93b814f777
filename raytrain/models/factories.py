"""A user's own model or dataset factory, found by its import path. Without torch: the job
manager resolves factories at submit, so that a typo is a 422 before anything is bought, and
it should not import torch to do so (3 s at each start of its process).

    build = resolve_factory("mylab.models:build", ("model", "factory"))
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from raytrain.errors import FieldError, SpecError


def resolve_factory(path: str, loc: tuple[str, ...]) -> Callable[..., Any]:
    """Import 'package.module:attr.attr' and return the callable, or raise SpecError at loc."""
    module_name, _, attr_path = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(
            [FieldError(loc, f"cannot import {module_name!r}: {exc}. To fix: install the "
                        "package on every node, or correct the path")]
        ) from None
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise SpecError(
                [FieldError(loc, f"{module_name!r} has no attribute {attr_path!r}. To fix: "
                            "name a callable defined in that module")]
            )
        target = getattr(target, part)
    if not callable(target):
        raise SpecError([FieldError(loc, f"{path!r} is not callable. To fix: name a function")])
    return target
