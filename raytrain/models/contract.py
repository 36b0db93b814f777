"""What a model of the user's own (`model.kind: import`) must do, checked where it is used.

The contract: the factory returns a `torch.nn.Module` whose forward takes int64 token ids
`[batch, seq]` and returns the logits `[batch, seq, vocab]`, as one of what the ecosystem's
models return:
- a tensor (the logits);
- a tuple or list whose first item is the logits (`return_dict=False` in `transformers`);
- an object or mapping with a `logits` entry (a `transformers` `CausalLMOutputWithPast`).
Anything else fails the job with an error that states this contract.

    logits = logits_of(model(tokens), model)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from raytrain.errors import TrainingError

CONTRACT = ("a model of your own (model.kind 'import') must map int64 tokens [batch, seq] to "
            "logits [batch, seq, vocab], returned as a tensor, a tuple whose first item is the "
            "logits, or an object with a `.logits` tensor (as Hugging Face models return)")


def logits_of(output: Any, model: nn.Module | None = None) -> torch.Tensor:
    """The logits in a forward's `output` (see the module docstring), checked to be 3-D."""
    logits: Any = output
    if isinstance(output, (tuple, list)) and output:
        logits = output[0]
    elif isinstance(output, Mapping) and "logits" in output:
        logits = output["logits"]
    elif not isinstance(output, torch.Tensor) and hasattr(output, "logits"):
        logits = output.logits
    if isinstance(logits, torch.Tensor) and logits.dim() == 3:
        return logits
    what = (f"a tensor of shape {tuple(logits.shape)}" if isinstance(logits, torch.Tensor)
            else type(output).__name__)
    name = type(model).__name__ if model is not None else "the model"
    raise TrainingError(f"{name}'s forward returned {what}, which holds no logits [batch, seq, "
                        f"vocab]: {CONTRACT}. To fix: return the logits so, or wrap the model "
                        "in a module whose forward does")
