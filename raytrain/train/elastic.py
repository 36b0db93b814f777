"""One replica group of an elastic job, training beside the others it can outlive.

The groups agree on every step through torchft: a Manager per rank, a quorum per step from
the job's Lighthouse, and the step's gradients summed across the groups in that quorum over a
process group torchft rebuilds when the quorum changes. Inside a group the job's layout runs
as usual (FSDP, tensor parallel) on the group's own process group. What torchft does not do,
and this module does:

- The math of an uninterrupted run whatever the number of groups alive: the step's global
  batch is cut into units (a micro-batch for each of the group's data ranks), and the groups
  in the quorum share them (raytrain.core.elastic.share_of_step); each group's gradient is
  its units' mean scaled by its share, so the sum over the groups is the global batch's mean
  gradient, as with every group alive. torchft's DDP would average whatever each group did.
- Healing with the job's whole state (weights, AdamW moments, the step), sharded or not, as
  local tensors (DTensors travel as their shards and are rebuilt on the same layout).
- The service's flags for the whole job (stop, move) ride in the step's all-reduce, as they
  do in the rigid loop's loss sync, so every group leaves at the same step; inside a group of
  several ranks, one more all-reduce makes every rank take the same decisions (stop, move,
  its nodes' notices, a checkpoint due by rank 0's clock), which only some ranks hear.
- A group whose node has a notice leaves at the step boundary; the last group alive
  checkpoints first. A step whose all-reduce failed (a group died) is not committed and is
  done again by the survivors: at most one step redone.

Only the group leading the quorum (participating rank 0) reports progress and writes the
periodic checkpoints: every group holds the same state. Every group reports the groups it
sees leave and join (a new leader knows no history; the service keeps one record of each).

    result = train_group(spec, inner_layout, worker, group=1, sink=sink, ...)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from raytrain.core.batching import BatchPlan
from raytrain.core.elastic import share_of_step
from raytrain.core.step_rules import after_step
from raytrain.parallel.parallelize import ParallelModel, clip_grad_norm
from raytrain.spec import JobSpec, Layout
from raytrain.train.checkpoint import CheckpointManager, _state
from raytrain.train.loop import (
    NoNotices,
    Notices,
    WorkerInfo,
    build_rank,
    resume_rank,
    save_step,
    start_meter,
    step_learning_rate,
)
from raytrain.train.progress import ProgressMeter, ProgressSink

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupSetup:
    """Where a group finds the others: the job's Lighthouse, its own store (its rank 0's
    TCPStore, as torchft needs one per group), and the ids of the groups."""

    lighthouse: str
    store_addr: str
    store_port: int
    replica_prefix: str  # + the group's index: torchft's replica id
    groups: int  # the job's replica groups (indices 0 .. groups - 1)
    timeout_s: float = 30.0
    heartbeat_s: float = 0.1


class GroupEvents:
    """What the leading group tells the service of the others (the service's GroupChanged):
    a group gone from the quorum (with the steps redone and the survivors' stall for it) and
    a group back in it."""

    def report(self, group: int, state: str, step: int, redone_steps: int = 0,
               stall_s: float | None = None) -> None:
        pass


def train_group(spec: JobSpec, layout: Layout, worker: WorkerInfo, group: int,
                setup: GroupSetup, sink: ProgressSink, checkpoint_root: Path | str,
                notices: Notices | None = None, events: GroupEvents | None = None,
                progress_interval_s: float = 1.0,
                die_when: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Train replica group `group` of the job (its `layout` is the group's: dp_replicate 1)
    until the job's last step, its node's notice, or the service's stop; the final figures.
    `die_when(step)`: die mid-step when it says so, as a node lost without notice does."""
    notices, events = notices or NoNotices(), events or GroupEvents()
    training = spec.training
    model, optimizers, source, inner = build_rank(spec, layout, worker)
    units = inner.grad_accum_steps  # a micro-batch for each of the group's data ranks
    checkpoints = CheckpointManager(checkpoint_root, worker.rank, keep=training.keep_checkpoints,
                                    world_size=worker.world_size, on_durable=sink.checkpoint)
    start_step, first_loss, last_loss = resume_rank(checkpoints, spec, model, optimizers, worker)
    # A replacement that boots after the others finished finds the last checkpoint: the job's
    # end was reported by the group that trained its last step, not by this one.
    ended_before = start_step >= training.steps

    manager = _torchft_manager(setup, worker, group, model, optimizers)
    manager.load_state_dict({"step": start_step, "batches_committed": 0})
    sink.started(start_step)
    meter = start_meter(spec, model, start_step, first_loss, progress_interval_s)
    params = model.parameters()
    members: set[int] | None = None
    failed, failed_since = 0, None  # uncommitted steps, and when the first of them began
    saved_at = time.monotonic()
    leaving = preempted = stopped = False
    loss_value, alive = last_loss, 1
    try:
        while manager.current_step() < training.steps:
            began = time.monotonic()
            step, alive, me, mine, quorum_s = _quorum(manager, units)
            loss_sum = _forward_backward(model, source, inner, step, mine, units, layout,
                                         worker)
            if die_when is not None and die_when(step):
                _die()
            flags = _reduce(manager, params, loss_sum, me == 0, sink, setup.groups, group)
            if not manager.should_commit():  # a group died mid-step: do it again
                failed += 1
                failed_since = failed_since or began
                continue
            stall = quorum_s if failed_since is None else began + quorum_s - failed_since
            members = _report_members(events, members, flags, setup.groups, step, failed, stall,
                                      quorum_s)
            failed, failed_since = 0, None
            lr, grad_norm = _optimizer_step(model, optimizers, spec, step)
            steps_done = step + 1
            loss_value = float(flags[0])
            if me == 0:  # the leader's norm alone is read (a wait for the device)
                meter.add_step(steps_done, loss_value, lr, float(grad_norm))
            if me == 0 and meter.record(steps_done, loss_value):
                sink.progress({**meter.snapshot(), "groups": alive})
            interval = sink.checkpoint_every_s() if me == 0 else None
            due = after_step(steps_done, training.steps, training.checkpoint_every_steps,
                             time.monotonic() - saved_at, interval).checkpoint
            stop_asked, move_asked, leaving, due = _agree_in_group(
                worker, bool(flags[1] > 0), bool(flags[2] > 0), notices.stop_requested, due)
            rule = after_step(steps_done, training.steps, training.checkpoint_every_steps,
                              0.0, None, stop_asked, due,
                              move_asked or (leaving and alive == 1))
            if me == 0 and rule.checkpoint and save_step(  # a stop or the last step waits for it
                    checkpoints, steps_done, model, optimizers, {
                        "samples_seen": inner.samples_consumed(steps_done),
                        "first_loss": meter.first_loss, "loss": loss_value,
                        "world_size": worker.world_size, "layout": layout.describe()},
                    meter, wait=rule.stop or leaving or steps_done >= training.steps):
                saved_at = time.monotonic()
            if rule.stop or leaving:
                stopped, preempted = True, rule.preempted or leaving
                break
        checkpoints.flush()
    finally:
        manager.shutdown(wait=False)
    result = _group_result(meter, loss_value, stopped, preempted, leaving, notices,
                           manager.current_step())
    # A group that left, or came after the end, is not the job's end.
    if worker.rank == 0 and not ended_before and (not leaving or alive == 1):
        sink.finished(result)
    return result


def _group_result(meter: ProgressMeter, loss_value: float, stopped: bool, preempted: bool,
                  leaving: bool, notices: Notices, steps: int) -> dict[str, Any]:
    """The group's final figures (`left`: it left on its node's notice)."""
    return {"first_loss": meter.first_loss if meter.first_loss is not None else loss_value,
            "final_loss": loss_value, "stopped": stopped, "preempted": preempted,
            "left": leaving, "noticed_at": notices.noticed_at,
            "checkpointed_at": time.time() if preempted and not leaving else None,
            "steps": steps, "tokens_per_s": 0.0,
            "train_wall_s": time.monotonic() - meter.started_at}


def _agree_in_group(worker: WorkerInfo, stop: bool, move: bool, leaving: bool, due: bool
                    ) -> tuple[bool, bool, bool, bool]:
    """What every rank of this group does after the step, as the rigid loop's loss sync
    agrees it: a stop or move any rank heard (the cross-group sum reaches each rank only
    from its peers of the same rank in the other groups, and only the leader's rank 0 hears
    the service), any rank's node notice, and a checkpoint due by rank 0's clock (the
    service's interval reaches rank 0 alone). One small all-reduce over the group's ranks;
    none for a group of one."""
    if worker.world_size == 1:
        return stop, move, leaving, due
    flags = torch.tensor([float(stop), float(move), float(leaving), float(due)],
                         dtype=torch.float64, device=worker.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    agreed = [bool(v > 0) for v in flags.tolist()]
    return agreed[0], agreed[1], agreed[2], agreed[3]


def _quorum(manager: Any, units: int) -> tuple[int, int, int | None, list[int], float]:
    """Join the step's quorum (synchronous: a group behind heals here, before the step): the
    step the others are at, the groups in the quorum, this group's place among them and its
    share of the step's units, and the seconds the quorum took."""
    began = time.monotonic()
    manager.start_quorum()
    quorum_s = time.monotonic() - began
    alive, me = manager.num_participants(), manager.participating_rank()
    mine = share_of_step(units, alive, me) if me is not None else []
    return manager.current_step(), alive, me, mine, quorum_s


def _reduce(manager: Any, params: list[torch.Tensor], loss_sum: float, leader: bool,
            sink: ProgressSink, groups: int, group: int) -> torch.Tensor:
    """Sum the gradients over the groups in the quorum, with the loss, the service's flags
    (stop, move: the leader's) and which groups took part in one more all-reduce of
    [loss, stop, move, group 0, group 1, ...]."""
    flags = torch.zeros(3 + groups, dtype=torch.float64)
    flags[:3] = torch.tensor([loss_sum, float(leader and sink.should_stop()),
                              float(leader and sink.should_move())])
    flags[3 + group] = 1.0
    works = [manager.allreduce(p.grad.to_local() if isinstance(p.grad, DTensor)
                               else p.grad, reduce_op=dist.ReduceOp.SUM)
             for p in params] + [manager.allreduce(flags, reduce_op=dist.ReduceOp.SUM)]
    for work in works:
        work.wait()
    return flags


def _torchft_manager(setup: GroupSetup, worker: WorkerInfo, group: int, model: ParallelModel,
                     optimizers: list[torch.optim.Optimizer]) -> Any:
    """torchft's Manager for this group's rank: its quorum through the job's Lighthouse, and
    the group's state (this rank's shards) for healing a peer, or being healed."""
    from torchft import Manager, ProcessGroupGloo

    def state_dict() -> dict[str, Any]:
        model_state, optim_state, _ = _state(model.parts, optimizers)
        return {"model": _local(model_state), "optim": _local(optim_state)}

    def load_state_dict(state: dict[str, Any]) -> None:
        _load_local(model.parts, optimizers, state)

    timeout = timedelta(seconds=setup.timeout_s)
    return Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, use_async_quorum=False,
        load_state_dict=load_state_dict, state_dict=state_dict, timeout=timeout,
        quorum_timeout=timeout, connect_timeout=timeout, rank=worker.rank,
        world_size=worker.world_size, store_addr=setup.store_addr,
        store_port=setup.store_port, lighthouse_addr=setup.lighthouse,
        replica_id=f"{setup.replica_prefix}{group}",
        heartbeat_interval=timedelta(seconds=setup.heartbeat_s))


def _report_members(events: GroupEvents, members: set[int] | None, flags: torch.Tensor,
                    groups: int, step: int, failed: int, stall_s: float, quorum_s: float
                    ) -> set[int]:
    """The groups in this committed step (from the all-reduced flags); those that went and
    came back since the last one are reported. Every group reports: a new leader knows no
    history, and the service keeps one record of each change."""
    now_members = {g for g in range(groups) if flags[3 + g] > 0}
    if members is not None:
        for gone in sorted(members - now_members):
            events.report(gone, "gone", step, failed, stall_s)
        for back in sorted(now_members - members):
            events.report(back, "training", step, 0, quorum_s)
    return now_members


def _forward_backward(model: Any, source: Any, plan: BatchPlan, step: int, mine: list[int],
                      units: int, layout: Layout, worker: WorkerInfo) -> float:
    """This group's units of the step: gradients of their mean loss, scaled by its share of
    the units, so the groups' sum is the step's mean; the scaled loss (the mean over the
    group's data ranks, as the rigid loop's loss sync has it)."""
    for part in model.parts:
        part.zero_grad(set_to_none=True)
    loss = torch.zeros((), dtype=torch.float64)
    if mine:
        batches = [source.batch(plan.sample_range(step, unit, model.dp_rank)) for unit in mine]
        loss = model.forward_backward(batches).detach().to(torch.float64).cpu()
    share = len(mine) / units
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif share != 1.0:
            p.grad.mul_(share)
    if worker.world_size > 1:  # the group's own ranks: average their losses
        loss = loss.to(worker.device)
        dist.all_reduce(loss)
        loss = loss.cpu() / layout.dp
    return float(loss) * share


def _optimizer_step(model: Any, optimizers: list[torch.optim.Optimizer], spec: JobSpec,
                    step: int) -> tuple[float, torch.Tensor]:
    """The update; its learning rate and the gradient norm before clipping (on the
    device)."""
    lr = step_learning_rate(step, spec)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
    grad_norm = clip_grad_norm(model, spec.training.grad_clip_norm)
    for optimizer in optimizers:
        optimizer.step()
    return lr, grad_norm


def _local(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of a state dict to send to a healing group: local shards, cloned, since the
    transport serves it later while this group trains on (on CPU it would not copy)."""
    def snapshot(value: Any) -> Any:
        if isinstance(value, DTensor):
            value = value.to_local()
        return value.detach().clone() if isinstance(value, torch.Tensor) else value

    return {k: snapshot(v) for k, v in state.items()}


def _load_local(parts: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer],
                state: dict[str, Any]) -> None:
    """Load healed state (local tensors) into this group's model and optimizers, rebuilding
    DTensors on this group's layout."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    from raytrain.train.checkpoint import _OPTIONS

    model_state, optim_state, keys = _state(parts, optimizers)
    for mine, theirs in ((model_state, state["model"]), (optim_state, state["optim"])):
        for key, value in list(mine.items()):
            got = theirs[key]
            mine[key] = DTensor.from_local(got, value.device_mesh, value.placements,
                                           run_check=False) \
                if isinstance(value, DTensor) else got
    for part, optimizer, (model_keys, optim_keys) in zip(parts, optimizers, keys):
        set_state_dict(part, optimizer,
                       model_state_dict={k: model_state[k] for k in model_keys},
                       optim_state_dict={k: optim_state[k] for k in optim_keys},
                       options=_OPTIONS)


def _die() -> None:
    import os

    os._exit(17)  # as a node lost mid-step: no clean-up, no report
