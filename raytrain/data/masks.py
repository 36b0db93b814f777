"""How a batch says which targets' loss is not taken (fine-tuning data's prompts).

A batch stays one int64 tensor of token ids [rows, seq_len + 1] through the prefetcher, the
micro-batching and a pipeline's schedule: a token whose loss is not taken is stored as
`-(id + 1)` (ids are never negative), and only where it is a target (column 0 is an input
alone). The loss reads it back: inputs the ids, targets the ids or IGNORE.

    batch = untrained_marked(tokens, trained)      # trained: bool, the same shape
    inputs, targets = inputs_and_targets(batch)    # targets IGNORE where not trained
"""

from __future__ import annotations

import torch

IGNORE = -100  # torch's cross_entropy ignore_index


def untrained_marked(batch: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """`batch` with each untrained target (`trained` False, past column 0) as -(id + 1)."""
    marked = ~trained
    marked[:, 0] = False
    return torch.where(marked, -batch - 1, batch)


def inputs_and_targets(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's inputs (every id) and targets (IGNORE where the loss is not taken)."""
    untrained = batch < 0
    ids = torch.where(untrained, -batch - 1, batch)
    return ids[:, :-1], torch.where(untrained, IGNORE, batch)[:, 1:]


def trained_targets(batch: torch.Tensor) -> int:
    """How many of a batch's targets are trained."""
    return int((batch[:, 1:] >= 0).sum())
