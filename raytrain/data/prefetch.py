"""The next step's micro-batches, prepared while this one trains.

A step's data (a synthetic batch, windows of a token file, a user's dataset) is read on a
background thread one step ahead, into pinned memory on a GPU, and copied to the device
without blocking the host; the step only waits if the data is slower than the step. The
batches a rank trains on depend only on (step, its micro-batch indices): the same as read in
line, whatever the timing. A request the thread did not foresee (a replica group whose share
of the step changed) is read at once, after the thread's read is done, so a user's dataset is
never read from two threads at the same time.

Why not torch's DataLoader: its workers are processes, with a sampler per epoch; ours are
windows of a global sample order that the batch plan gives per step and rank, and one thread
is enough to keep a step's few micro-batches ahead.

    batches = Prefetcher(source, plan, dp_rank=0, device=device)
    tokens, trained = batches.get(step, units=[0, 1])  # on the device; step + 1 being read

With masked data (raytrain.data.masks) a step's loss is the mean over its trained targets,
every rank's: `trained` is their count in the step's global batch (the source counts it
from its spans, reading no tokens), from which the loop scales each micro-batch's summed
loss (ParallelModel.loss_scale); None for data whose every target is trained.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from raytrain.core.batching import BatchPlan
from raytrain.data.sources import TokenSource

Read = tuple[list[torch.Tensor], int | None]


def trained_targets(source: TokenSource, samples: range) -> int | None:
    """How many targets of the global batch `samples` a masked source trains; None for a
    source whose every target is trained."""
    if not getattr(source, "masked", False):
        return None
    return int(source.trained(samples))  # type: ignore[attr-defined]


def loss_scale(plan: BatchPlan, trained: int | None) -> float | None:
    """What each micro-batch's summed loss is multiplied by for the step's loss to be the
    mean over its `trained` targets, however the step is cut (ParallelModel.loss_scale); a
    step with none trains nothing. None: unmasked data, each micro-batch's mean."""
    return None if trained is None else plan.micro_batches_per_step / max(1, trained)


class Prefetcher:
    def __init__(self, source: TokenSource, plan: BatchPlan, dp_rank: int,
                 device: torch.device) -> None:
        self.source, self.plan, self.dp_rank, self.device = source, plan, dp_rank, device
        self.pin = device.type == "cuda"
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="raytrain-data")
        self._ahead: tuple[tuple[int, tuple[int, ...]], Future[Read]] | None = None
        self.waited_s = 0.0  # the steps' waits for their data, since the caller last took it

    def get(self, step: int, units: list[int]) -> Read:
        """Step `step`'s micro-batches `units` of this rank, on the device, and the step's
        trained targets (module doc); starts reading the same units of the next step."""
        began = time.perf_counter()
        key = (step, tuple(units))
        got: Read | None = None
        if self._ahead is not None:
            foreseen, future = self._ahead
            read = future.result()  # also: never two reads at once
            got = read if foreseen == key else None
        if got is None:
            got = self._read(step, units)
        self._ahead = ((step + 1, key[1]), self._pool.submit(self._read, step + 1, units))
        on_device = [b.to(self.device, non_blocking=True) for b in got[0]]
        self.waited_s += time.perf_counter() - began
        return on_device, got[1]

    def settle(self) -> None:
        """Wait for the read ahead to finish (its batches are kept), so that the caller may
        read the same source itself (the validation batches) without two reads at once."""
        if self._ahead is not None:
            self._ahead[1].result()

    def take_waited_s(self) -> float:
        """The seconds steps waited for their data since the last call."""
        waited, self.waited_s = self.waited_s, 0.0
        return waited

    def _read(self, step: int, units: list[int]) -> Read:
        batches = [self.source.batch(self.plan.sample_range(step, unit, self.dp_rank))
                   for unit in units]
        trained = trained_targets(self.source, self.plan.step_samples(step))
        return [b.pin_memory() for b in batches] if self.pin else batches, trained

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
