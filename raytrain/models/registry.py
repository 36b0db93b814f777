"""Build the model a JobSpec names: the built-in GPT, or a user factory by import path.

    model = build_model(spec.model)
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch import nn

from raytrain.errors import FieldError, SpecError
from raytrain.models.gpt import GPT
from raytrain.spec import ModelSpec


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


def build_model(spec: ModelSpec, seed: int = 0) -> nn.Module:
    """The model with its initial weights (under `torch.device("meta")`: shapes only)."""
    if spec.kind == "gpt":
        return GPT(spec.gpt, seed=seed)
    torch.manual_seed(seed)
    assert spec.factory is not None  # the spec guarantees it
    model = resolve_factory(spec.factory, ("model", "factory"))(**spec.options)
    if not isinstance(model, nn.Module):
        raise SpecError(
            [FieldError(("model", "factory"), f"{spec.factory!r} returned "
                        f"{type(model).__name__}, not a torch.nn.Module")]
        )
    return model
