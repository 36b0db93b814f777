"""Where a job's validation loss is measured (data.validation): a held-out share of the
training data that training then never reads, or a source of its own, read in order.

- token files and shards: the last `fraction` of the windows are held out; training wraps
  (and shuffles) within the others;
- synthetic data: samples from far beyond any training index (2^40 on), which training
  never reaches;
- a user's dataset: its last `fraction` of items.

    train, held_out = with_validation(spec.data, vocab_size, build_source(spec.data, vocab))
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from raytrain.core.shuffle import held_out_windows
from raytrain.data.sources import ImportedDataset, SyntheticTokens, TokenSource, build_source
from raytrain.spec import DataSpec

SYNTHETIC_OFFSET = 1 << 40


class HeldOut:
    """Windows `start .. start + count - 1` of a source, read in order (sample j: window
    start + j mod count)."""

    def __init__(self, source: Any, start: int, count: int) -> None:
        self.source, self.start, self.count = source, start, count
        self.seq_len = source.seq_len

    @property
    def masked(self) -> bool:
        return bool(getattr(self.source, "masked", False))

    def batch(self, indices: Sequence[int]) -> torch.Tensor:
        return self.source.window_rows(self._windows(indices))

    def trained(self, indices: Sequence[int]) -> int:
        return int(self.source.trained_in_windows(self._windows(indices)))

    def _windows(self, indices: Sequence[int]) -> list[int]:
        return [self.start + int(i) % self.count for i in indices]


class Beyond:
    """A synthetic source's samples from SYNTHETIC_OFFSET on."""

    def __init__(self, source: SyntheticTokens) -> None:
        self.source, self.seq_len = source, source.seq_len

    def batch(self, indices: Sequence[int]) -> torch.Tensor:
        return self.source.batch([SYNTHETIC_OFFSET + int(i) for i in indices])


def with_validation(spec: DataSpec, vocab_size: int | None, source: TokenSource
                    ) -> tuple[TokenSource, TokenSource | None]:
    """The training source (narrowed when a share is held out) and the validation one."""
    validation = spec.validation
    if validation is None:
        return source, None
    if validation.path is not None:
        own = spec.model_copy(update={"kind": "token_file", "path": validation.path,
                                      "shuffle": False, "validation": None})
        return source, build_source(own, vocab_size)
    assert validation.fraction is not None  # the spec guarantees one of them
    if isinstance(source, SyntheticTokens):
        return source, Beyond(source)
    if isinstance(source, ImportedDataset):
        total = len(source.dataset)  # type: ignore[arg-type]
        held = held_out_windows(total, validation.fraction)
        source.size = total - held
        return source, HeldOut(source, total - held, held)
    total = source.num_windows  # type: ignore[attr-defined]
    held = held_out_windows(total, validation.fraction)
    source.num_windows = total - held  # type: ignore[attr-defined]
    return source, HeldOut(source, total - held, held)
