"""One replica group of an elastic job, training beside the others it can outlive: the
`Members` that raytrain.train.loop.train trains among when a job has replica groups.

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
- The service's flags for the whole job (stop, move) ride in the step's all-reduce, so every
  group's rank 0 hears the leading group's; the loop's sync, every step, makes every rank of
  a group take the same decision.
- A step whose all-reduce failed (a group died) is not committed and is done again by the
  survivors: at most one step redone.

Only the group leading the quorum (participating rank 0) reports progress and writes the
periodic checkpoints: every group holds the same state. Every group reports the groups it
sees leave and join (a new leader knows no history; the service keeps one record of each).

    members = ReplicaGroup(GroupSetup(...), group=1, worker=worker)
    result = train(spec, worker, sink, root, layout=inner_layout, members=members)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from raytrain.core.elastic import share_of_step
from raytrain.errors import TrainingError
from raytrain.parallel.model import ParallelModel
from raytrain.train.checkpoint import _state
from raytrain.train.heartbeats import Heartbeats, wait_watched
from raytrain.train.loop import Exchanged, Turn
from raytrain.train.progress import ProgressMeter
from raytrain.train.rank import WorkerInfo

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
    beats: str | None = None  # "host:port" of the job's beat store (train.heartbeats)
    heal_wait_s: float = 30.0  # a replacement's wait for a live group to heal from (after the
    # job's end none comes: it fails, and the runner, done, lets it go)


class NoGroupToHeal(RuntimeError):
    """A replacement found no live group to take the job's state from."""


HEAL_FAILED = "could not load a live group's state"


class HealFailed(TrainingError):
    """A group could not load the state a live group sent it: a defect, not a lost node.
    Its runner fails the run (elastic_launcher) rather than start it again and again while
    the others train on without it."""


def healer(group: int, model: ParallelModel, optimizers: list[torch.optim.Optimizer],
           meter: ProgressMeter) -> Callable[[dict[str, Any]], None]:
    """The function torchft calls with a live group's state: loads it into this group's
    model and optimizers; HealFailed, naming the group and the cause, if it cannot."""
    def load_state_dict(state: dict[str, Any]) -> None:
        try:
            _load_local(model.parts, optimizers, state)
        except Exception as exc:
            raise HealFailed(f"replica group {group} {HEAL_FAILED} ({type(exc).__name__}: "
                             f"{exc}), so it cannot train beside the others. To fix: resume "
                             "the job from its checkpoint (raytrain resume ID), and report "
                             "this") from exc
        if meter.first_loss is None:  # the job's, not this group's first step
            meter.first_loss = state.get("first_loss")
    return load_state_dict


class GroupEvents:
    """What the leading group tells the service of the others (the service's GroupChanged):
    a group gone from the quorum (with the steps redone and the survivors' stall for it) and
    a group back in it."""

    def report(self, group: int, state: str, step: int, redone_steps: int = 0,
               stall_s: float | None = None) -> None:
        pass


class ReplicaGroup:
    """This rank's replica group among the job's others (module doc). `die_when(step)`: die
    mid-step when it says so, as a node lost without notice does (tests)."""

    every_step = True

    def __init__(self, setup: GroupSetup, group: int, worker: WorkerInfo,
                 events: GroupEvents | None = None,
                 die_when: Callable[[int], bool] | None = None, heals: bool = False) -> None:
        self.setup, self.group, self.worker = setup, group, worker
        self.heals = heals  # a replacement: its state comes from a live group (no storage)
        self.events = events or GroupEvents()
        self.die_when = die_when
        self.manager: Any = None
        self.members: set[int] | None = None
        self.failed = 0  # uncommitted steps
        self.failed_since: float | None = None  # when the first of them began
        self.began = self.quorum_s = 0.0
        self.beats: Heartbeats | None = None

    def start(self, step: int, model: ParallelModel, optimizers: list[torch.optim.Optimizer],
              meter: ProgressMeter) -> None:
        quiet_torchft()
        self.manager = _torchft_manager(self.setup, self.worker, self.group, model, optimizers,
                                        meter)
        self.manager.load_state_dict({"step": step, "batches_committed": 0})
        if self.setup.beats is not None:
            self.beats = Heartbeats(self.setup.beats, self.group, self.worker.rank,
                                    self.worker.world_size)
            self.beats.start()

    def turn(self, step: int, units: int) -> Turn:
        """Join the step's quorum (synchronous: a group behind heals here, before the step):
        the step the others are at, and this group's share of its units."""
        self.began = time.monotonic()
        self.manager.start_quorum()
        self.quorum_s = time.monotonic() - self.began
        alive, me = self.manager.num_participants(), self.manager.participating_rank()
        if self.heals:
            # The Lighthouse may form a quorum of this group alone (half of those it hears,
            # after its join timeout) while the others are mid-step: ask again until one of
            # them is in it, and torchft heals this group from it.
            deadline = time.monotonic() + self.setup.heal_wait_s
            while alive < 2 and self.manager.current_step() == 0:
                if time.monotonic() > deadline:
                    raise NoGroupToHeal(
                        f"replica group {self.group} was started to heal from a live group "
                        f"and found none in {self.setup.heal_wait_s:.0f} s: the job resumes "
                        "from its checkpoint")
                time.sleep(0.1)
                self.manager.start_quorum()
                alive, me = self.manager.num_participants(), \
                    self.manager.participating_rank()
            self.heals = False  # healed (torchft loaded a live group's state) or joined at 0
            self.quorum_s = time.monotonic() - self.began
        mine = share_of_step(units, alive, me) if me is not None else []
        return Turn(self.manager.current_step(), mine, len(mine) / units, me == 0, alive)

    def exchange(self, step: int, model: ParallelModel, loss: torch.Tensor, stop: bool,
                 move: bool) -> Exchanged | None:
        """Sum the gradients over the groups in the quorum, with the loss, the service's
        flags and which groups took part; None if a group died mid-step."""
        if self.die_when is not None and self.die_when(step):
            _die()
        params = model.parameters()
        for p in params:  # every group sends every gradient, a share of none included
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flags = _reduce(self.manager, params, loss, stop, move, self.setup.groups, self.group,
                        self.beats, self.members or set())
        if not self.manager.should_commit():
            self.failed += 1
            self.failed_since = self.failed_since or self.began
            return None
        stall = self.quorum_s if self.failed_since is None else \
            self.began + self.quorum_s - self.failed_since
        self.members = _report_members(self.events, self.members, flags, self.setup.groups,
                                       step, self.failed, stall, self.quorum_s)
        self.failed, self.failed_since = 0, None
        return Exchanged(flags[0], bool(flags[1] > 0), bool(flags[2] > 0))

    def ends_job(self, left: bool, came_after_end: bool) -> bool:
        """A group that left is not the job's end; nor is a replacement that booted after
        the others finished (it found the last checkpoint: the job's end was reported by the
        group that trained its last step)."""
        return not came_after_end and not left

    def progress(self, turn: Turn) -> dict[str, Any]:
        return {"groups": turn.alive}

    def close(self) -> None:
        if self.beats is not None:
            self.beats.stop()
        if self.manager is not None:
            self.manager.shutdown(wait=False)


def _reduce(manager: Any, params: list[torch.nn.Parameter], loss: torch.Tensor, stop: bool,
            move: bool, groups: int, group: int, beats: Heartbeats | None = None,
            members: set[int] | frozenset[int] = frozenset()) -> torch.Tensor:
    """Sum the gradients over the groups in the quorum, with the loss, the service's flags
    (stop, move: the leader's) and which groups took part in one more all-reduce of
    [loss, stop, move, group 0, group 1, ...]. A group of the last step (`members`) that
    falls silent meanwhile (`beats`) fails the step, which the others then do again without
    it (train.heartbeats)."""
    flags = torch.zeros(3 + groups, dtype=torch.float64)
    flags[0] = loss.to(torch.float64).cpu()
    flags[1:3] = torch.tensor([float(stop), float(move)])
    flags[3 + group] = 1.0
    works = [manager.allreduce(p.grad.to_local() if isinstance(p.grad, DTensor)
                               else p.grad, reduce_op=dist.ReduceOp.SUM)
             for p in params] + [manager.allreduce(flags, reduce_op=dist.ReduceOp.SUM)]
    # The transport's own futures: torchft's work reports a failed wait to its manager,
    # and a wait given up on must not fail a later step when gloo's timeout ends it.
    pending = [getattr(work, "_work", None) for work in works]
    if beats is not None and all(w is not None for w in pending):
        lost = wait_watched([w.get_future() for w in pending if w is not None], beats,
                            members)
        if lost:
            logger.warning("replica groups %s silent for %.0f s: this step is done again "
                           "without them", sorted(lost), beats.lost_after_s)
            manager.report_error(RuntimeError(f"replica groups {sorted(lost)} silent"))
            return flags
    for work in works:
        work.wait()
    return flags


def _torchft_manager(setup: GroupSetup, worker: WorkerInfo, group: int, model: ParallelModel,
                     optimizers: list[torch.optim.Optimizer], meter: ProgressMeter) -> Any:
    """torchft's Manager for this group's rank: its quorum through the job's Lighthouse, and
    the group's state (this rank's shards) for healing a peer, or being healed."""
    from torchft import Manager, ProcessGroupGloo

    def state_dict() -> dict[str, Any]:
        model_state, optim_state, _ = _state(model.parts, optimizers)
        return {"model": _local(model_state), "optim": _local(optim_state),
                "first_loss": meter.first_loss}

    load_state_dict = healer(group, model, optimizers, meter)
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
    if now_members != members:  # the one line per change of membership (module doc)
        logger.info("step %d: replica groups %s in the quorum", step, sorted(now_members))
    if members is not None:
        for gone in sorted(members - now_members):
            events.report(gone, "gone", step, failed, stall_s)
        for back in sorted(now_members - members):
            events.report(back, "training", step, 0, quorum_s)
    return now_members


# torchft's own loggers: a line per quorum, commit and step from each rank (780 lines for a
# 60-step job); this module logs each change of membership instead.
TORCHFT_LOGGERS = ("torchft", "torchft_quorums", "torchft_commits")


def quiet_torchft() -> None:
    """Keep torchft's per-step INFO lines out of the workers' logs (its warnings stay)."""
    for name in TORCHFT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


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
