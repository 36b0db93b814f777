"""Build the model a JobSpec names: the built-in GPT, or a user factory by import path.

    model = build_model(spec.model)
"""

from __future__ import annotations

import torch
from torch import nn

from raytrain.errors import FieldError, SpecError
from raytrain.models.factories import resolve_factory
from raytrain.models.gpt import GPT
from raytrain.spec import ModelSpec


def build_model(spec: ModelSpec, seed: int = 0) -> nn.Module:
    """The model with its initial weights (under `torch.device("meta")`: shapes only)."""
    if spec.builtin:
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
