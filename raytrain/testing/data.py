"""Data sources as defined, step by step: the reference the vectorised ones are checked
and timed against."""

from __future__ import annotations

from typing import Sequence

import torch

from raytrain.data.sources import SyntheticTokens


def stepped(source: SyntheticTokens, indices: Sequence[int]) -> torch.Tensor:
    """The chain as defined: position by position (what the vectorised batch replaced)."""
    length = source.seq_len + 1
    rows = []
    for index in indices:
        gen = torch.Generator().manual_seed(source.seed * 1_000_003 + int(index))
        resets = torch.rand(length, generator=gen) < source.RESET_PROBABILITY
        fresh = torch.randint(source.vocab_size, (length,), generator=gen)
        row = [int(fresh[0])]
        for t in range(1, length):
            row.append(int(fresh[t]) if resets[t] else int(source.successor[row[-1]]))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.int64)
