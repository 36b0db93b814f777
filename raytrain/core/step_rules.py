"""When a training loop checkpoints and stops, after each optimizer step: one rule for the
real per-worker loop (raytrain.train.loop) and for the workers a trace replay simulates
(raytrain.sim.trace_cloud), so a replayed job checkpoints when a real one would.

A checkpoint is due every `checkpoint_every_steps`, at the last step, when the service's
interval for the capacity held has passed since the last save (the policy's, for its
preemption risk), when a node may be taken (a rebalance recommendation), and before stopping
for a notice, a move or the service's stop (a cancel: a job resumed later goes on from the
step it was cancelled at, not from its last periodic checkpoint).

    due = after_step(steps_done=120, total_steps=1000, every_steps=50, since_save_s=700.0,
                     interval_s=600.0)      # StepRule(checkpoint=True, stop=False, ...)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRule:
    checkpoint: bool
    stop: bool
    preempted: bool  # stops for its node (a notice) or a move: with a checkpoint


def after_step(steps_done: int, total_steps: int, every_steps: int, since_save_s: float,
               interval_s: float | None, service_stop: bool = False,
               checkpoint_asked: bool = False, leave: bool = False) -> StepRule:
    """What the loop does once `steps_done` steps are done (module doc). `leave`: a notice
    for some rank's node, or the service's move."""
    on_time = interval_s is not None and since_save_s >= interval_s
    checkpoint = (steps_done % every_steps == 0 or steps_done == total_steps or on_time
                  or checkpoint_asked or leave or service_stop)
    return StepRule(checkpoint, service_stop or leave, leave)
