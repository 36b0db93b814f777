"""A launched worker group, simulated for a trace replay (raytrain.sim.trace_cloud): it
keeps the real loop's rules (raytrain.core.step_rules) and, for an elastic job, the replica
groups' (raytrain.core.elastic), and reports to the live job manager as real workers do.

- It starts `restart_s` after its launch, resumes from its job's latest committed
  checkpoint, trains at the step time the planner predicts for its nodes, reports progress
  every `report_s` and takes the manager's answers (stop, move, the checkpoint interval), and
  checkpoints every checkpoint_every_steps, at the policy's interval and at the end (stalling
  `checkpoint_s`, committed at its end).
- Rigid (one group): a notice makes it checkpoint and stop; a node lost without one kills it.
- Elastic (replica groups over its nodes): a notice makes the node's groups leave at the next
  step boundary (nothing lost); a node lost without one takes its groups at once (the step in
  flight is done again); either way the survivors stall `group_stall_s` and train on,
  slower by their share, while the cloud brings a node for each lost group: the replacement
  starts (`restart_s`), heals from a live group (its state over the offer's network) and
  joins at a step boundary. With fewer groups alive than the job's min_replica_groups it
  falls back to the rigid path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TypeVar

from raytrain.core.elastic import elastic_groups
from raytrain.core.step_rules import after_step
from raytrain.spec import JobSpec, Layout

TRAINING, LEAVING, GONE, HEALING = "training", "leaving", "gone", "healing"
F = TypeVar("F", bound=Callable[..., Any])


def _changes(method: F) -> F:
    """A SimRun method that may change when it next acts: next_time is worked out again."""
    def changing(self: SimRun, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            self._next = None
    return changing  # type: ignore[return-value]


@dataclass(frozen=True)
class CloudTimes:
    """The truth the simulated cloud and workers follow; the service measures what it sees
    of them (checkpoint stall, restart, node-ready) as it would live."""

    ready_s: float = 120.0  # from asking for a node to its being up
    restart_s: float = 30.0  # from capacity in hand to the first step (start, load, resume)
    checkpoint_s: float = 60.0  # one checkpoint's stall, durable at its end
    report_s: float = 30.0  # progress reports (a live rank 0 reports every second)
    idle_s: float = 60.0  # the autoscaler lets a node go once unwanted this long
    group_stall_s: float = 3.0  # survivors' stall when a replica group leaves or joins


class SimCloud(Protocol):
    """What a simulated run needs of its cloud (sim.trace_cloud.TraceCloud): the times it
    follows, the clock, the job manager it reports to, every node by id, and each job's latest
    committed checkpoint step."""

    times: CloudTimes
    time: float
    manager: Any
    nodes: dict[str, Any]
    committed: dict[str, int]


class SimRun:
    """One launched worker group, simulated (module doc)."""

    def __init__(self, cloud: SimCloud, job_id: str, spec: JobSpec, layout: Layout,
                 nodes: list[str], step_s: float, heal_s: float, launched_at: float) -> None:
        self.cloud, self.job_id, self.spec, self.nodes = cloud, job_id, spec, nodes
        self.step_s, self.heal_s = step_s, heal_s
        self.total = spec.training.steps
        self.every = spec.training.checkpoint_every_steps
        self.attempt = 0
        self.done = False
        self.error: str | None = None
        self.phase = "starting"  # starting | training | saving | stalled
        self.phase_until = launched_at + cloud.times.restart_s
        self.step = self.started_step = 0
        self.train_started = self.boundary_at = self.saved_at = math.inf
        self.reported_at = -math.inf
        self.interval_s: float | None = None
        self.stop_asked = self.move_asked = False
        self.noticed_at: float | None = None
        self.after_save: tuple[bool, bool] | None = None  # (stop, preempted) once saved
        # Replica groups (one: rigid), each on its nodes, and its state.
        count = elastic_groups(spec, layout, len(nodes)) if len(nodes) >= 2 else 1
        self.members: dict[int, list[str]] = _spread(count, nodes)
        self.state = {g: TRAINING for g in self.members}
        self.joins: dict[int, float] = {}  # healing group -> when it can join
        self.lost_at: dict[int, float] = {}  # gone group -> when
        # Nodes its groups heard a notice on: no replacement goes there, as live (the job
        # manager's run_view `avoid`, from the run's noticed nodes).
        self.noticed_nodes: set[str] = set()
        self._next: float | None = None  # next_time, until a change (the cloud asks often)

    # ------------------------------------------------------------------ the cloud asks

    @property
    def elastic(self) -> bool:
        return len(self.members) > 1

    @property
    def alive(self) -> int:
        return sum(1 for s in self.state.values() if s in (TRAINING, LEAVING))

    def nodes_wanted(self) -> int:
        """Nodes this run holds or waits for (a gone group waits for one of its own)."""
        held = {n for g, ns in self.members.items() if self.state[g] != GONE for n in ns}
        per_group = max(1, len(self.nodes) // len(self.members))
        waiting = sum(per_group for s in self.state.values() if s == GONE)
        return len(held) + waiting if self.elastic else len(self.nodes)

    def using(self) -> set[str]:
        return {n for g, ns in self.members.items() if self.state[g] != GONE for n in ns}

    def next_time(self) -> float:
        if self._next is None:
            self._next = math.inf if self.done else self.phase_until \
                if self.phase != "training" else \
                self.boundary_at + self._steps_to_next() * self._effective_step_s()
        return self._next

    @_changes
    def hear_notice(self, node: str, now: float) -> None:
        """The metadata service on `node` says it is being taken."""
        if not self.elastic:
            self.noticed_at = self.noticed_at or now
            return
        self.noticed_nodes.add(node)
        for group, nodes in self.members.items():
            if node in nodes and self.state[group] == TRAINING:
                self.state[group] = LEAVING
                self._report_group(group, LEAVING, now)
        if self.alive - self._leaving() < self.spec.parallel.min_replica_groups:
            self.noticed_at = self.noticed_at or now  # too few would be left: all stop

    @_changes
    def node_lost(self, node: str, now: float) -> None:
        """`node` is gone without (or before the end of) its notice."""
        if not self.elastic or self.phase == "starting":
            self.end(error=f"ActorDiedError: a training worker died: its node {node} was lost")
            return
        hit = [g for g, ns in self.members.items() if node in ns and self.state[g] != GONE]
        for group in hit:
            was = self.state[group]
            self.state[group] = GONE
            self.joins.pop(group, None)
            self.lost_at[group] = now
            if was in (TRAINING, LEAVING):
                self._group_gone(group, now, notice=False)
        if self.alive < self.spec.parallel.min_replica_groups or not self.alive:
            self.end(error=f"ActorDiedError: a training worker died: its node {node} was "
                     f"lost, and {self.alive} replica group(s) are left")

    @_changes
    def node_free(self, node: str, now: float) -> bool:
        """A node of the run's type is up and unused: a gone group starts on it, unless its
        notice was heard (it is going). True if taken."""
        if node in self.noticed_nodes:
            return False
        for group in sorted(self.members):
            if self.state[group] == GONE:
                per_group = max(1, len(self.nodes) // len(self.members))
                self.members[group] = [node] if per_group == 1 else \
                    self.members[group][1:] + [node]
                self.state[group] = HEALING
                self.joins[group] = now + self.cloud.times.restart_s + self.heal_s
                self._report_group(group, HEALING, now)
                return True
        return False

    @_changes
    def fire(self) -> None:
        """What happens at next_time()."""
        now = self.cloud.time
        if self.phase == "starting":
            self._start(now)
        elif self.phase == "saving":
            self._saved(now)
        elif self.phase == "stalled":
            self.phase, self.boundary_at = "training", now
        else:  # a step boundary: the steps done since the last one, at the rate trained
            done = math.floor((now - self.boundary_at) / self._effective_step_s() + 1e-6)
            self.step = min(self.total, self.step + max(1, done))
            self.boundary_at = now
            self._after_step(now)

    @_changes
    def end(self, error: str | None = None, result: dict[str, Any] | None = None) -> None:
        if self.done:
            return
        self.done, self.error = True, error
        if result is not None and self.cloud.manager is not None:
            self.cloud.manager.report_finished(self.job_id, self.attempt, result)

    # ------------------------------------------------------------------------------------

    def _leaving(self) -> int:
        return sum(1 for s in self.state.values() if s == LEAVING)

    def _effective_step_s(self) -> float:
        """The step time with the live groups taking the lost ones' shares."""
        training = sum(1 for s in self.state.values() if s in (TRAINING, LEAVING))
        return self.step_s * len(self.members) / max(training, 1)

    def _steps_to_next(self) -> int:
        """Steps until the next boundary where anything may happen (at least one)."""
        s, t0, step_s = self.step, self.boundary_at, self._effective_step_s()
        marks = [self.total - s, self.every - s % self.every]
        report_at = self.reported_at + self.cloud.times.report_s  # the first: at once
        for due in (report_at if math.isfinite(report_at) else t0, self.noticed_at,
                    None if self.interval_s is None else self.saved_at + self.interval_s,
                    t0 if self._leaving() else None,
                    min(self.joins.values(), default=None)):
            if due is not None and math.isfinite(due):
                marks.append(math.ceil(max(0.0, due - t0) / step_s - 1e-9))
        return max(1, min(marks))

    def _start(self, now: float) -> None:
        manager = self.cloud.manager
        self.step = self.started_step = self.cloud.committed.get(self.job_id, 0)
        kind = self.cloud.nodes[self.nodes[0]].kind if self.nodes else None
        self.attempt = manager.worker_group_started(self.job_id, self.step, {
            "placement_group": f"pg-{self.job_id}-{now:.0f}", "nodes": len(self.nodes),
            "accelerator": kind.offer.gpu_kind if kind else "cpu"})
        if self.attempt < 0 or self.step >= self.total:
            self.end(result=self._result(now, preempted=False) if self.attempt >= 0 else None)
            return
        for group, nodes in self.members.items():
            if self.elastic:
                self._report_group(group, TRAINING, now)
        self.phase, self.train_started = "training", now
        self.boundary_at = self.saved_at = now

    def _after_step(self, now: float) -> None:
        stall = self._groups_at_boundary(now)
        if self.done:
            return
        if now - self.reported_at >= self.cloud.times.report_s or self.step >= self.total:
            self._report(now)
        rule = after_step(self.step, self.total, self.every, now - self.saved_at,
                          self.interval_s, self.stop_asked, False,
                          self.noticed_at is not None or self.move_asked)
        if rule.checkpoint:
            self.phase, self.phase_until = "saving", now + stall + self.cloud.times.checkpoint_s
            self.after_save = (rule.stop or self.step >= self.total, rule.preempted)
        elif rule.stop:
            self.end(result=self._result(now, preempted=False))
        elif stall:
            self.phase, self.phase_until = "stalled", now + stall

    def _groups_at_boundary(self, now: float) -> float:
        """Leaving groups leave, healed ones join; the survivors' stall for it."""
        stall = 0.0
        for group, state in list(self.state.items()):
            if state == LEAVING and self.noticed_at is None:
                self.state[group] = GONE
                self.lost_at[group] = now
                self._group_gone(group, now, notice=True)
                stall = self.cloud.times.group_stall_s
            elif state == HEALING and self.joins.get(group, math.inf) <= now:
                del self.joins[group]
                self.state[group] = TRAINING
                self._report_group(group, TRAINING, now, stall_s=self.cloud.times.group_stall_s)
                stall = self.cloud.times.group_stall_s
        return stall

    def _group_gone(self, group: int, now: float, notice: bool) -> None:
        """A group left (at a boundary, after a notice) or died (mid-step: its step is done
        again by the survivors, after they notice)."""
        redone = 0
        if not notice and self.phase == "training" and now > self.boundary_at:
            redone = 1  # the step in flight
        self._report_group(group, GONE, now, notice=notice, redone=redone,
                           stall_s=self.cloud.times.group_stall_s)
        if self.phase == "training" and self.alive:
            self.phase, self.phase_until = "stalled", now + self.cloud.times.group_stall_s

    def _report_group(self, group: int, state: str, now: float, notice: bool = False,
                      redone: int = 0, stall_s: float | None = None) -> None:
        if self.attempt > 0:
            self.cloud.manager.report_group(self.job_id, self.attempt, group, state,
                                            self.members[group], self.step, notice, redone,
                                            stall_s)

    def _saved(self, now: float) -> None:
        self.cloud.committed[self.job_id] = self.step
        self.saved_at = now
        self.cloud.manager.report_checkpoint(self.job_id, self.attempt, self.step,
                                             f"sim://{self.job_id}/step-{self.step}",
                                             self.cloud.times.checkpoint_s)
        stop, preempted = self.after_save or (False, False)
        self.after_save = None
        if stop:
            self.end(result=self._result(now, preempted))
            return
        self.phase, self.boundary_at = "training", now

    def _report(self, now: float) -> None:
        self.reported_at = now
        step_s = self._effective_step_s()
        reply = self.cloud.manager.report_progress(self.job_id, self.attempt, {
            "step": self.step, "total_steps": self.total, "loss": _loss(self.step, self.total),
            "first_loss": _loss(0, self.total),
            "tokens_per_s": self.spec.tokens_per_step / step_s, "step_s": step_s,
            "elapsed_s": now - self.train_started,
            "eta_s": (self.total - self.step) * step_s, "sent_at": now})
        self.stop_asked = self.stop_asked or bool(reply.get("stop"))
        self.move_asked = self.move_asked or bool(reply.get("move"))
        if "checkpoint_every_s" in reply:
            self.interval_s = reply["checkpoint_every_s"]

    def _result(self, now: float, preempted: bool) -> dict[str, Any]:
        wall = max(now - self.train_started, 1e-9) if math.isfinite(self.train_started) else 0.0
        steps_run = self.step - self.started_step
        return {"first_loss": _loss(0, self.total), "final_loss": _loss(self.step, self.total),
                "stopped": True, "preempted": preempted, "noticed_at": self.noticed_at,
                "checkpointed_at": now if preempted else None, "steps": self.step,
                "train_wall_s": wall,
                "tokens_per_s": steps_run * self.spec.tokens_per_step / wall if wall else 0.0}


def _spread(groups: int, nodes: list[str]) -> dict[int, list[str]]:
    """Groups over nodes: whole nodes per group, or whole groups per node."""
    if groups <= 1:
        return {0: list(nodes)}
    if len(nodes) >= groups:
        per = len(nodes) // groups
        return {g: nodes[g * per:(g + 1) * per] for g in range(groups)}
    per = groups // len(nodes)
    return {g: [nodes[g // per]] for g in range(groups)}


def _loss(step: int, total: int) -> float:
    """A made-up falling loss curve: the replay trains nothing, but a status shows a loss."""
    return 2.0 + 8.0 * math.exp(-3.0 * step / max(total, 1))
