"""Data off the step's path: the synthetic tokens built without a Python loop over positions
(the same tokens), and the next step's micro-batches read on a thread while a step trains."""

from __future__ import annotations

import threading
import time
from typing import Sequence

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain.core.batching import BatchPlan
from raytrain.data.prefetch import Prefetcher
from raytrain.data.sources import SyntheticTokens
from raytrain.testing.data import stepped


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 300), st.integers(1, 2100), st.integers(0, 10**6),
       st.lists(st.integers(0, 10**9), min_size=1, max_size=4))
def test_the_vectorised_chain_is_the_stepped_one_bit_for_bit(
        vocab: int, seq_len: int, seed: int, indices: list[int]) -> None:
    """Any vocabulary, length (past powers of two), seed and samples."""
    source = SyntheticTokens(vocab, seq_len, seed)
    assert torch.equal(source.batch(indices), stepped(source, indices))


class Recording:
    """A source that records which samples were read, from which thread."""

    seq_len = 4

    def __init__(self) -> None:
        self.reads: list[tuple[int, str]] = []
        self.lock = threading.Lock()
        self.active = 0
        self.overlapped = False

    def batch(self, indices: Sequence[int]) -> torch.Tensor:
        with self.lock:
            self.active += 1
            self.overlapped |= self.active > 1
        time.sleep(0.01)
        with self.lock:
            self.reads.append((indices[0], threading.current_thread().name))
            self.active -= 1
        return torch.tensor([[i] * 5 for i in indices])


def test_the_next_steps_batches_are_read_ahead_and_are_the_ones_read_in_line() -> None:
    """After step s is handed out, step s + 1 is read on the data thread before it is asked
    for; what comes back is what reading in line gives, an unforeseen request included (a
    replica group's share changed), and no two reads of the source ever overlap. Without the
    read-ahead (`get` reading in line) every read is on the main thread and the test fails."""
    source, plan = Recording(), BatchPlan(8, 2, 2)
    data = Prefetcher(source, plan, dp_rank=1, device=torch.device("cpu"))
    try:
        for step, units in ((0, [0, 1]), (1, [0, 1]), (2, [0, 1]), (3, [1]), (4, [1])):
            got, trained = data.get(step, units)
            assert trained is None  # every target trained
            expected = [torch.tensor([[i] * 5 for i in plan.sample_range(step, u, 1)])
                        for u in units]
            assert all(torch.equal(a, b) for a, b in zip(got, expected)), step
            first_next = plan.sample_range(step + 1, units[0], 1)[0]
            deadline = time.monotonic() + 30
            while not any(i == first_next for i, _ in source.reads):
                assert time.monotonic() < deadline, f"step {step + 1} was not read ahead"
                time.sleep(0.005)
            ahead = [name for i, name in source.reads if i == first_next]
            assert ahead and ahead[0].startswith("raytrain-data"), ahead
    finally:
        data.close()
    assert not source.overlapped
