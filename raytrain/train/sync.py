"""When a group's ranks agree on the loss and on what to do next: one small all-reduce every
few steps (every step in a job of replica groups, whose groups must leave together).

Rank 0 alone hears from the service (stop, move, the checkpoint interval), and each rank its
own node's notices; the flags ride in the same all-reduce as the loss, so every rank of the
group takes the same decision at the same step. Reducing every step would add a barrier per
step (about 4% of a small model's throughput on 2 CPU ranks, measured with
benchmarks/loop_overhead.py), so the reduction happens about every `target_s` seconds of
training instead. The interval is rank 0's choice from its measured step time, and it
travels in the same all-reduce, so every rank knows the next sync step without another
message. `target_s=0` syncs every step.

    sync = LossSync(world_size=2, rank=0, target_s=0.5, dp=2)
    if sync.due(forced=last_step):
        synced = sync.reduce(losses, Heard(stop=sink.should_stop()))
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Heard:
    """What one rank heard since the last sync."""

    stop: bool = False  # the service asked the job to stop (a cancel)
    checkpoint: bool = False  # a checkpoint is due (the service's interval), or a node may go
    move: bool = False  # the service asked the job to checkpoint and move to other capacity
    notice: bool = False  # this rank's node is being taken


@dataclass(frozen=True)
class Synced:
    losses: tuple[float, ...]  # each step's since the last sync, the latest last
    heard: Heard  # what any rank of the group heard

    @property
    def loss(self) -> float:
        return self.losses[-1]


class LossSync:
    """Module doc."""

    MAX_INTERVAL = 1000

    def __init__(self, world_size: int, rank: int, target_s: float, dp: int = 0,
                 device: torch.device | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.world_size = world_size
        self.dp = dp or world_size  # ranks whose loss shares add up to the job's loss
        self.rank = rank
        self.target_s = target_s
        self.device = device
        self.clock = clock
        self.interval = 1
        self._since = 0
        self._window_started = clock()

    def due(self, forced: bool) -> bool:
        """Call once per step, after it; True when this step's loss must be reduced."""
        self._since += 1
        return forced or self._since >= self.interval

    def reduce(self, loss_sum: torch.Tensor, heard: Heard = Heard()) -> Synced:
        """Mean loss over data-parallel ranks (others pass 0) of each step since the last
        sync (`loss_sum`: one value a step, the latest last) and what any rank heard; sets
        the next interval."""
        now = self.clock()
        next_interval = 0.0
        if self.rank == 0:
            step_s = (now - self._window_started) / max(1, self._since)
            wanted = self.target_s / step_s if step_s > 0 else self.MAX_INTERVAL
            next_interval = float(min(self.MAX_INTERVAL, max(1, int(wanted))))
        device = self.device or loss_sum.device
        flags = [float(heard.stop), float(heard.checkpoint), float(heard.move),
                 float(heard.notice), next_interval]
        values = torch.cat([torch.tensor(flags, dtype=torch.float64, device=device),
                            loss_sum.to(device=device, dtype=torch.float64).reshape(-1)])
        if self.world_size > 1:
            dist.all_reduce(values)
        read = values.tolist()  # one read of the device
        self.interval = max(1, int(read[4])) if self.target_s > 0 else 1
        self._since = 0
        self._window_started = now
        agreed = Heard(read[0] > 0, read[1] > 0, read[2] > 0, read[3] > 0)
        return Synced(tuple(v / self.dp for v in read[5:]), agreed)
