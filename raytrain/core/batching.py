"""Which samples each rank reads at each step: the data position as plain arithmetic.

Optimizer step `s` consumes global samples [s * G, (s + 1) * G) for global batch G, whatever
the data-parallel degree. Within a step, micro-step `a` and data-parallel rank `r` read a
contiguous slice of that range. Because the slice depends on the step and not on the worker
count, a job resumed on a different number of ranks reads no sample twice and skips none.

    plan = BatchPlan(global_batch_size=16, micro_batch_size=4, dp_degree=2)
    plan.sample_range(step=3, micro_step=1, dp_rank=0)   # range(56, 60)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    global_batch_size: int
    micro_batch_size: int
    dp_degree: int

    def __post_init__(self) -> None:
        per_micro_step = self.micro_batch_size * self.dp_degree
        if min(self.global_batch_size, self.micro_batch_size, self.dp_degree) < 1:
            raise ValueError(f"batch sizes and degree must be positive: {self}")
        if self.global_batch_size % per_micro_step:
            raise ValueError(
                f"global batch {self.global_batch_size} is not a multiple of "
                f"micro batch x dp = {per_micro_step}"
            )

    @property
    def grad_accum_steps(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.dp_degree)

    def sample_range(self, step: int, micro_step: int, dp_rank: int) -> range:
        """The global sample indices rank `dp_rank` reads in `micro_step` of `step`."""
        if not 0 <= micro_step < self.grad_accum_steps or not 0 <= dp_rank < self.dp_degree:
            raise ValueError(f"micro_step {micro_step} / dp_rank {dp_rank} out of range")
        start = (
            step * self.global_batch_size
            + micro_step * self.micro_batch_size * self.dp_degree
            + dp_rank * self.micro_batch_size
        )
        return range(start, start + self.micro_batch_size)

    def step_samples(self, step: int) -> range:
        """The global sample indices of `step`, every rank's."""
        return range(step * self.global_batch_size, (step + 1) * self.global_batch_size)

    @property
    def micro_batches_per_step(self) -> int:
        """Across every data-parallel rank."""
        return self.global_batch_size // self.micro_batch_size

    def samples_consumed(self, steps_done: int) -> int:
        """The data position after `steps_done` optimizer steps."""
        return steps_done * self.global_batch_size
