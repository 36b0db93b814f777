"""What a job's lifecycle speaks (raytrain.core.lifecycle): the table of states and moves, a
job's record and the effects the job manager carries out (the events that happen to a job
are lifecycle.events). Plain frozen values; the decisions over them are `lifecycle.step`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Union

from raytrain.catalog.prices import usd_for
from raytrain.errors import IllegalTransition
from raytrain.spec import (
    CostFigure,
    JobState,
    JobStatus,
)
from raytrain.spec.status import Bill

_ENDS = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

# state -> the states it may move to. A move to the same state updates the reason only.
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    # queued: it starts, is refused on start (FAILED) or is cancelled
    JobState.PENDING: frozenset({JobState.PENDING, JobState.PROVISIONING, JobState.RECOVERING,
                                 *_ENDS}),
    # nodes asked for / worker group starting: it runs, its nodes do not come (back to
    # PENDING), or it fails to start
    JobState.PROVISIONING: frozenset({JobState.PENDING, JobState.PROVISIONING,
                                      JobState.RUNNING, JobState.RECOVERING, *_ENDS}),
    JobState.RUNNING: frozenset({JobState.PENDING, JobState.RUNNING, JobState.RECOVERING,
                                 *_ENDS}),
    JobState.RECOVERING: frozenset({JobState.PENDING, JobState.RUNNING, JobState.RECOVERING,
                                    *_ENDS}),
    **{end: frozenset() for end in _ENDS},
}

# What a job in each state may hold; the move to an end releases it (ReleaseNodes, and the
# runner stops at its next report or is stopped by StopOverdue).
HOLDS: dict[JobState, tuple[str, ...]] = {
    JobState.PENDING: (),
    JobState.PROVISIONING: ("node request", "worker group"),
    JobState.RUNNING: ("node request", "worker group"),
    JobState.RECOVERING: ("node request", "worker group"),
    **{end: () for end in _ENDS},
}

# Records are saved on every state change and checkpoint, and at least this often while
# progress comes in (a report a second at most).
PROGRESS_SAVE_INTERVAL_S = 5.0
# How long a cancelled worker group has to leave on its own before it is killed: rank 0
# reads the stop at its next report. A group that has not started yet has nothing to save:
# it is stopped at once (its placement group goes with the runner that asked for it).
CANCEL_GRACE_S = 20.0
# After an interruption notice the instance goes within two minutes; wait that long at most
# for the noticed nodes to leave before resuming on the same node type.
NOTICE_GRACE_S = 150.0


def allowed(old: JobState, new: JobState) -> bool:
    return new in TRANSITIONS[old]


def enter(job: JobStatus, state: JobState, reason: str) -> None:
    """Move `job` to `state` for `reason`; its message becomes the reason while it waits or
    fails (a running or finished job has none)."""
    if not reason:
        raise ValueError("every move of a job's state names its reason")
    if not allowed(job.state, state):
        raise IllegalTransition(job.id, job.state.value, state.value)
    job.state = state
    job.message = None if state in (JobState.RUNNING, JobState.SUCCEEDED) else reason


# ---------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Run:
    """A job's current worker group, as values (its runner's handle stays with the manager)."""

    demand: Mapping[str, float]
    launched_at: float  # capacity in hand, worker group asked for
    usd_per_hour: float = 0.0  # what its nodes cost while held (0 on a fixed cluster)
    nodes_at_launch: frozenset[str] = frozenset()  # bought nodes alive at launch (Ray ids)
    describe: str = ""  # nodes and layout, for the preemption log
    attempt: int = 0
    progress_step: int = -1
    placement_group: str | None = None  # reported by rank 0; lets a hard stop free it
    result: Mapping[str, Any] | None = None  # rank 0's final report
    stop_by: float | None = None  # asked to stop: killed if still there at this time
    moving_to: str | None = None  # the policy moves the job: checkpoint, stop, resume there
    reviewed_at: float = 0.0
    budget_usd: float | None = None  # the job's budget: on reaching it, checkpoint and stop
    over_budget: bool = False  # asked to checkpoint and stop for the budget
    groups: int = 1  # replica groups that train on when others are lost (1: rigid)
    group_nodes: Mapping[int, frozenset[str]] = field(default_factory=dict)  # as reported
    # Nodes a group left on a notice: they are going, so no replacement is placed there.
    noticed_nodes: frozenset[str] = frozenset()

    @property
    def nodes(self) -> frozenset[str]:
        """Every node the run has trained on: those at launch and those groups joined on."""
        return self.nodes_at_launch.union(*self.group_nodes.values())


# The nodes a job is billed for now: node id -> (held since, dollars per node-hour).
Held = Mapping[str, "tuple[float, float]"]


@dataclass(frozen=True)
class Record:
    """Everything the service knows of one job. Its bill is part of its status, saved with
    it (status.bill): the nodes it holds, each from when it was granted, and the dollars of
    those it has let go."""

    status: JobStatus
    run: Run | None = None
    last_failure: tuple[str, int] | None = None  # the last error and the step it ended at
    passed: int = 0  # times a later job started first (backfill)
    leaving: tuple[float, frozenset[str]] | None = None  # after a notice: (until, nodes)
    saved_at: float = 0.0

    @property
    def held(self) -> Held:
        return self.status.bill.held


def checkpoint_every_s(job: JobStatus) -> float | None:
    """The policy's checkpoint interval for the capacity the job holds: its latest decision
    for capacity (None: no preemption risk there, the job's own checkpoint_every_steps)."""
    for decision in reversed(job.decisions):
        if decision.offer is not None and decision.action in ("start", "stay", "switch"):
            return decision.checkpoint_interval_s
    return None


STALE_CHECKPOINT_FACTOR = 3.0  # intervals without a durable checkpoint before a warning
STALE_CHECKPOINT_MIN_S = 60.0


def stale_checkpoint_warning(job: JobStatus, since: float, now: float) -> str | None:
    """A warning when the job's last durable checkpoint (or, before its first, `since`: the
    run's start) is older than STALE_CHECKPOINT_FACTOR of its checkpoint intervals: the
    uploads are failing (the store is down) while training goes on."""
    every_s = checkpoint_every_s(job)
    step_s = job.plan.measured_step_s if job.plan is not None else None
    if every_s is None and step_s:
        every_s = job.spec.training.checkpoint_every_steps * step_s
    if not every_s:
        return None
    committed = job.checkpoint.committed_at if job.checkpoint is not None else None
    age = now - max(committed or 0.0, since)  # a new run counts from its start
    if age < max(STALE_CHECKPOINT_MIN_S, STALE_CHECKPOINT_FACTOR * every_s):
        return None
    what = (f"the last durable checkpoint (step {job.checkpoint.step})"
            if job.checkpoint is not None else "no checkpoint")
    return (f"{what} is {age / 60:.0f} min old, though one is due every "
            f"{every_s / 60:.1f} min: the job's storage is not taking its uploads (retried in "
            "the background; the workers' logs say why). Training goes on; a preemption now "
            "would lose the work since then")


def waiting(record: Record) -> bool:
    """Queued, or (autoscaled) provisioning with no worker group yet."""
    state = record.status.state
    return state == JobState.PENDING or (
        state in (JobState.PROVISIONING, JobState.RECOVERING) and record.run is None)


def noticed_nodes_present(record: Record, now: float, alive: frozenset[str]) -> bool:
    """After a notice: none of the noticed nodes has gone yet, and the grace has not ended."""
    if record.leaving is None:
        return False
    until, nodes = record.leaving
    return now < until and nodes <= alive


# ---------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Emit:
    """Append to the job's event stream."""

    kind: str
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Save:
    """Write the record to the durable store."""


@dataclass(frozen=True)
class ReleaseNodes:
    """Withdraw the job's request for nodes (the autoscaler lets idle ones go)."""


@dataclass(frozen=True)
class StopRunner:
    """End the job's runner actor; `hard`: also remove its worker group's placement group
    (`placement_group`, or any group no run holds when it never said which); `reclaim`: the
    run was replica groups, each with a placement group of its own that the run never named
    (one still starting when the run ended is held by no one): remove any no run holds."""

    hard: bool = False
    placement_group: str | None = None
    reclaim: bool = False


@dataclass(frozen=True)
class Rebuy:
    """The job's nodes were taken: count it against the offer and decide where it resumes."""

    nodes: frozenset[str]


@dataclass(frozen=True)
class Replace:
    """An elastic job is about to lose `leaving` nodes (their notice came: they are still up)
    and has lost `lost` without one: its node request is its count plus the leaving ones,
    sent now while either is more than 0 (withdrawn at 0 and 0: the worker groups hold their
    nodes), so every replacement is bought at once."""

    leaving: int
    lost: int = 0


Effect = Union[Emit, Save, ReleaseNodes, StopRunner, Rebuy, Replace]


@dataclass(frozen=True)
class Outcome:
    record: Record
    effects: tuple[Effect, ...] = ()
    reply: Any = None


def _working_copy(job: JobStatus) -> JobStatus:
    """A copy of a status that a handler may change without touching the original: the
    status and the parts handlers change in place (the lists it appends to, the plan's
    measured step, the costs' figures) are copied; the rest (the spec above all, a large
    document no handler changes) is shared. A deep copy of every status on every report was
    most of the job manager's time per report."""
    copy = job.model_copy()
    copy.decisions = list(job.decisions)
    copy.preemption_log = list(job.preemption_log)  # entries: copied before a change
    copy.plan = job.plan.model_copy() if job.plan is not None else None
    copy.costs = job.costs.model_copy()
    return copy


class Change:
    """One step of the lifecycle at work: a copy of the status to change, and the effects so
    far; `outcome` makes them the step's result. The input record is never changed."""

    def __init__(self, record: Record, now: float) -> None:
        self.now = now
        self.job = _working_copy(record.status)
        self.run = record.run
        self.last_failure = record.last_failure
        self.passed = record.passed
        self.leaving = record.leaving
        self.saved_at = record.saved_at
        self.held = dict(record.status.bill.held)
        self.closed_usd = record.status.bill.closed_usd
        self.effects: list[Effect] = []
        self.save = False

    def move(self, state: JobState, reason: str, **extra: Any) -> None:
        enter(self.job, state, reason)
        self.emit("state", {"state": state.value, "message": reason, **extra})
        self.save = True

    def emit(self, kind: str, data: Mapping[str, Any]) -> None:
        self.effects.append(Emit(kind, dict(data)))

    def set_run(self, **changes: Any) -> None:
        assert self.run is not None
        self.run = replace(self.run, **changes)

    def bill(self) -> None:
        """Dollars spent: the nodes let go, and each node held from when it was granted."""
        held = sum(usd_for(price, self.now - since) for since, price in self.held.values())
        self.job.cost_usd = self.closed_usd + held

    def hold(self, nodes: frozenset[str], usd_per_hour: float) -> None:
        """The job holds exactly `nodes` from now: bill the ones gone up to now."""
        for node in [n for n in self.held if n not in nodes]:
            since, price = self.held.pop(node)
            self.closed_usd += usd_for(price, self.now - since)
        for node in nodes - set(self.held):
            self.held[node] = (self.now, usd_per_hour)
        self.bill()

    def end(self) -> None:
        """Close the stream and withdraw the node request (the nodes stop billing to the
        job); the record is saved."""
        self.hold(frozenset(), 0.0)
        self.effects.append(ReleaseNodes())
        self.last_failure, self.passed = None, 0
        self.emit("end", {"state": self.job.state.value, "error": self.job.error})
        self.save = True

    def outcome(self, reply: Any) -> Outcome:
        if self.save:
            self.effects.append(Save())
            self.saved_at = self.now
        self.job.bill = Bill(held=dict(self.held), closed_usd=self.closed_usd)
        record = Record(self.job, self.run, self.last_failure, self.passed, self.leaving,
                        self.saved_at)
        return Outcome(record, tuple(self.effects), reply)


def sampled(figure: CostFigure, value_s: float, mean: bool = False) -> CostFigure:
    """A measured figure with one more sample: the mean of them all, or the latest."""
    n = figure.samples
    if mean and n:
        value_s = ((figure.measured_s or 0.0) * n + value_s) / (n + 1)
    return figure.model_copy(update={"measured_s": value_s, "samples": n + 1})
