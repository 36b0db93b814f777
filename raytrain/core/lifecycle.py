"""A job's life as one pure function: `step(record, event, now) -> Outcome(record, effects,
reply)`. This module is the only place a job's state is assigned.

    PENDING -> PROVISIONING -> RUNNING <-> RECOVERING -> SUCCEEDED | FAILED | CANCELLED

A `Record` is everything the service knows of one job: its public `JobStatus` and, while a
worker group runs, the `Run` values (attempt, billing, the nodes it started on). Events are
what happens to a job: a request (`Submitted`, `CancelRequested`), a scheduling decision
(`Queued`, `CapacityDecided`, `Launched`, `Reviewed`), a report from rank 0 (`GroupStarted`,
`ProgressReported`, `CheckpointCommitted`, `FinalReport`), or what the cluster did
(`RunEnded`, `StopOverdue`, `ServiceRestarted`, `ServiceStopping`). Recovery, billing and
preemption accounting are decided here and returned as values; the job manager keeps the new
record and carries out the effects (events on the job's stream, store writes, releasing its
nodes, stopping its runner) through its Ray adaptor.

    out = step(record, ProgressReported(attempt=1, payload=report), now=time.time())
    record = out.record        # the input record is never changed
    for effect in out.effects: ...   # Emit, Save, ReleaseNodes, StopRunner, Rebuy
    return out.reply           # {"stop": False, "move": False}

Every move names its reason; moves back to PENDING (capacity went away, the service
restarted) are allowed only from the states in TRANSITIONS, and an ended job never moves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Union

from raytrain.errors import IllegalTransition
from raytrain.spec import (
    CheckpointInfo,
    DecisionRecord,
    JobResult,
    JobState,
    JobStatus,
    PreemptionRecord,
    Progress,
    Resources,
)

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
# How long a cancelled worker group has to leave on its own before it is killed: once it
# runs, rank 0 reads the stop at its next report; while it still starts, it stops as soon as
# it is up (GroupStarted answers -1), which can take Ray Train's whole start timeout.
CANCEL_GRACE_S = 20.0
CANCEL_STARTING_GRACE_S = 120.0
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
    cost_before: float = 0.0  # dollars the job spent before this run
    nodes_at_launch: frozenset[str] = frozenset()  # bought nodes alive at launch (Ray ids)
    describe: str = ""  # nodes and layout, for the preemption log
    attempt: int = 0
    progress_step: int = -1
    placement_group: str | None = None  # reported by rank 0; lets a hard stop free it
    result: Mapping[str, Any] | None = None  # rank 0's final report
    stop_by: float | None = None  # asked to stop: killed if still there at this time
    moving_to: str | None = None  # the policy moves the job: checkpoint, stop, resume there
    reviewed_at: float = 0.0


@dataclass(frozen=True)
class Record:
    """Everything the service knows of one job."""

    status: JobStatus
    run: Run | None = None
    last_failure: tuple[str, int] | None = None  # the last error and the step it ended at
    passed: int = 0  # times a later job started first (backfill)
    leaving: tuple[float, frozenset[str]] | None = None  # after a notice: (until, nodes)
    saved_at: float = 0.0


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


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Submitted:
    pass


@dataclass(frozen=True)
class Queued:
    message: str  # why it waits (its place in the queue)


@dataclass(frozen=True)
class Passed:
    """A job behind this one started first (see core.capacity.backfill)."""


@dataclass(frozen=True)
class CapacityDecided:
    """The policy decided where the job runs (resources), or that nothing fits (None)."""

    decision: DecisionRecord
    resources: Resources | None
    message: str


@dataclass(frozen=True)
class Launched:
    run: Run


@dataclass(frozen=True)
class GroupStarted:
    resumed_step: int
    placement_group: str | None = None
    accelerator: str = "cpu"
    nodes: int = 1


@dataclass(frozen=True)
class ProgressReported:
    attempt: int
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class CheckpointCommitted:
    attempt: int
    step: int
    path: str


@dataclass(frozen=True)
class FinalReport:
    attempt: int
    result: Mapping[str, Any]


@dataclass(frozen=True)
class RunEnded:
    """The runner returned: `error` is the failure it raised (None: it returned), `alive`
    the cluster's nodes now (a node the run started on that is gone was lost)."""

    error: str | None
    alive: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StopOverdue:
    """A worker group asked to stop is still there after its grace."""


@dataclass(frozen=True)
class CancelRequested:
    pass


@dataclass(frozen=True)
class Reviewed:
    """The policy looked at the running job again; `decision` when it moves it."""

    decision: DecisionRecord | None = None
    resources: Resources | None = None
    moving_to: str | None = None


@dataclass(frozen=True)
class ServiceRestarted:
    pass


@dataclass(frozen=True)
class ServiceStopping:
    pass


Event = Union[Submitted, Queued, Passed, CapacityDecided, Launched, GroupStarted,
              ProgressReported, CheckpointCommitted, FinalReport, RunEnded, StopOverdue,
              CancelRequested, Reviewed, ServiceRestarted, ServiceStopping]


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
    (`placement_group`, or any group no run holds when it never said which)."""

    hard: bool = False
    placement_group: str | None = None


@dataclass(frozen=True)
class Rebuy:
    """The job's nodes were taken: count it against the offer and decide where it resumes."""

    nodes: frozenset[str]


Effect = Union[Emit, Save, ReleaseNodes, StopRunner, Rebuy]


@dataclass(frozen=True)
class Outcome:
    record: Record
    effects: tuple[Effect, ...] = ()
    reply: Any = None


# ---------------------------------------------------------------------------- the function


def step(record: Record, event: Event, now: float) -> Outcome:
    """The job after `event` at unix time `now`, and what to do about it. A scheduling
    decision for a job that no longer waits, or that ended (a cancel won the race), changes
    nothing; cancelling an ended job raises IllegalTransition."""
    if isinstance(event, _FOR_WAITING) and not waiting(record) or \
            record.status.state.is_terminal and isinstance(event, _DECISIONS):
        return Outcome(record)
    change = _Change(record, now)
    reply = _HANDLERS[type(event)](change, event)
    return change.outcome(reply)


class _Change:
    """One step's working copy: a copy of the status to change, and the effects so far."""

    def __init__(self, record: Record, now: float) -> None:
        self.now = now
        self.status = record.status.model_copy(deep=True)
        self.run = record.run
        self.last_failure = record.last_failure
        self.passed = record.passed
        self.leaving = record.leaving
        self.saved_at = record.saved_at
        self.effects: list[Effect] = []
        self.save = False

    @property
    def job(self) -> JobStatus:
        return self.status

    def move(self, state: JobState, reason: str, **extra: Any) -> None:
        enter(self.status, state, reason)
        self.emit("state", {"state": state.value, "message": reason, **extra})
        self.save = True

    def emit(self, kind: str, data: Mapping[str, Any]) -> None:
        self.effects.append(Emit(kind, dict(data)))

    def set_run(self, **changes: Any) -> None:
        assert self.run is not None
        self.run = replace(self.run, **changes)

    def bill(self) -> None:
        """Dollars spent: earlier runs plus this run's nodes for as long as held."""
        run = self.run
        if run is not None and run.usd_per_hour:
            held_h = max(0.0, self.now - run.launched_at) / 3600
            self.status.cost_usd = max(self.status.cost_usd,
                                       run.cost_before + held_h * run.usd_per_hour)

    def end(self) -> None:
        """Close the stream and withdraw the node request; the record is saved."""
        self.bill()
        self.effects.append(ReleaseNodes())
        self.last_failure, self.passed = None, 0
        self.emit("end", {"state": self.status.state.value, "error": self.status.error})
        self.save = True

    def outcome(self, reply: Any) -> Outcome:
        if self.save:
            self.effects.append(Save())
            self.saved_at = self.now
        record = Record(self.status, self.run, self.last_failure, self.passed, self.leaving,
                        self.saved_at)
        return Outcome(record, tuple(self.effects), reply)


def _submitted(c: _Change, event: Submitted) -> None:
    c.move(JobState.PENDING, "queued")


def _queued(c: _Change, event: Queued) -> None:
    if c.job.message != event.message:
        c.move(JobState.PENDING, event.message)


def _passed(c: _Change, event: Passed) -> None:
    c.passed += 1


def _capacity_decided(c: _Change, event: CapacityDecided) -> None:
    c.job.decisions.append(event.decision)
    if event.resources is not None:
        c.job.resources = event.resources
    state = JobState.RECOVERING if c.job.state == JobState.RECOVERING else \
        JobState.PROVISIONING if event.resources is not None else JobState.PENDING
    c.move(state, event.message)


def _launched(c: _Change, event: Launched) -> None:
    c.run = replace(event.run, cost_before=c.job.cost_usd)
    c.passed, c.leaving = 0, None
    if c.job.state != JobState.RECOVERING:
        c.move(JobState.PROVISIONING, "starting the worker group")


def _group_started(c: _Change, event: GroupStarted) -> int:
    if c.run is None:
        return -1
    c.set_run(attempt=c.run.attempt + 1, progress_step=-1,
              placement_group=event.placement_group)
    job = c.job
    if job.state.is_terminal:  # cancelled while the group was starting: stop now
        c.set_run(stop_by=c.now + CANCEL_GRACE_S)
        return -1
    if job.resources.node_type is None:  # a fixed cluster: what the workers found
        job.resources = Resources(
            accelerator=event.accelerator, market="local", nodes=event.nodes,
            gpus=c.run.demand.get("GPU", 0.0), cpus=c.run.demand.get("CPU", 0.0),
            hourly_usd=0.0)
    if job.started_at is None:
        job.started_at = c.now
    if c.run.attempt == 1 and job.restarts == 0 and job.state != JobState.RECOVERING:
        c.move(JobState.RUNNING, "training")
    else:
        if c.run.attempt > 1:
            job.restarts += 1
        c.move(JobState.RECOVERING,
               f"worker group restarted; resuming from step {event.resumed_step}",
               resumed_step=event.resumed_step)
    return c.run.attempt


def _progress(c: _Change, event: ProgressReported) -> dict[str, bool]:
    run, job = c.run, c.job
    if run is None or event.attempt != run.attempt:
        return {"stop": True}  # a report from a run no longer tracked
    if run.stop_by is not None or job.state.is_terminal:
        return {"stop": True}
    reply = {"stop": False, "move": run.moving_to is not None}
    step_reached = int(event.payload["step"])
    if step_reached < run.progress_step:  # overtaken by a later report
        return reply
    first_report = run.progress_step < 0
    c.set_run(progress_step=step_reached)
    c.bill()
    if first_report and job.preemption_log and job.preemption_log[-1].after is None:
        _resumed_after_preemption(c)
    if job.state == JobState.RECOVERING:
        c.move(JobState.RUNNING, "training")
    job.progress = Progress.model_validate(
        {k: v for k, v in event.payload.items() if k != "sent_at"})
    if job.plan is not None and job.progress.tokens_per_s:
        job.plan.measured_step_s = job.plan.tokens_per_step / job.progress.tokens_per_s
    # sent_at stays in the event: followers can see how fresh each report is.
    c.emit("progress", event.payload)
    if c.now - c.saved_at >= PROGRESS_SAVE_INTERVAL_S:
        c.save = True
    return reply


def _resumed_after_preemption(c: _Change) -> None:
    assert c.run is not None
    job, last = c.job, c.job.preemption_log[-1]
    last.after = c.run.describe
    last.capacity_to_first_step_s = c.now - c.run.launched_at
    last.down_s = c.now - last.time
    step_s = job.plan.measured_step_s if job.plan and job.plan.measured_step_s else 0.0
    last.extra_cost_usd = job.resources.hourly_usd * (
        last.down_s + last.lost_steps * step_s) / 3600
    job.down_s += last.down_s
    job.preemption_cost_usd += last.extra_cost_usd
    c.save = True


def _checkpoint(c: _Change, event: CheckpointCommitted) -> None:
    if c.run is None or event.attempt != c.run.attempt:
        return
    c.job.checkpoint = CheckpointInfo(step=event.step, path=event.path)
    if not c.job.state.is_terminal:  # a cancelled job's stream has already ended
        c.emit("checkpoint", {"step": event.step, "path": event.path})
    c.save = True


def _final_report(c: _Change, event: FinalReport) -> None:
    if c.run is not None and event.attempt == c.run.attempt:
        c.set_run(result=dict(event.result))


def _run_ended(c: _Change, event: RunEnded) -> None:
    run = c.run
    if run is None:
        return
    c.effects.append(StopRunner())
    if c.job.state.is_terminal:  # a cancelled job already has its end
        c.run = None
        return
    c.bill()
    error = event.error
    if error is None and not run.result:
        error = "training ended without a final report"
    if not _recovered(c, run, error, event.alive):
        _finish(c, run, error)
    c.run = None


def _recovered(c: _Change, run: Run, error: str | None, alive: frozenset[str]) -> bool:
    """On bought capacity, the manager (not Ray Train) restarts a stopped worker group: after
    a notice (the workers checkpointed and stopped), after a node loss without one (a
    preemption too: it never uses the failure budget), or after an error worth another try.
    True if the job goes on."""
    job, result = c.job, run.result or {}
    preempted = error is None and bool(result.get("preempted"))
    if preempted and run.moving_to:
        c.move(JobState.RECOVERING, f"moving to {run.moving_to} from step "
               f"{result.get('steps')}, as the policy decided")
        return True
    if preempted:
        notice = True
    elif error is not None and run.nodes_at_launch - alive:
        notice = False
    elif error is not None and _worth_retrying(c, run, error):
        job.restarts += 1
        c.move(JobState.RECOVERING, f"restarting after an error "
               f"({job.restarts} of {job.spec.training.max_restarts}): {error}")
        return True
    else:
        return False
    saved = job.checkpoint.step if job.checkpoint else None
    # After a notice the workers say where they stopped; after a loss, the last report (sent
    # about once a second) is all there is: a lower bound.
    reached = int(result.get("steps") or max(job.progress.step, run.progress_step, saved or 0))
    noticed, durable = result.get("noticed_at"), result.get("checkpointed_at")
    record = PreemptionRecord(
        time=c.now, notice=notice, reached_step=reached, checkpoint_step=saved,
        lost_steps=max(0, reached - (saved or 0)),
        notice_to_checkpoint_s=durable - noticed if noticed and durable else None,
        before=run.describe)
    job.preemptions += 1
    job.preemption_log.append(record)
    job.lost_steps += record.lost_steps
    c.effects.append(Rebuy(run.nodes_at_launch))  # on bought nodes: decide where it resumes
    if notice:  # the noticed nodes go within two minutes: do not start on them again
        c.leaving = (c.now + NOTICE_GRACE_S, run.nodes_at_launch)
    c.emit("preemption", record.model_dump(mode="json"))
    c.move(JobState.RECOVERING, (
        f"preempted {'after a notice' if notice else 'without notice'} at step {reached}; "
        f"resuming from step {saved or 0} on the policy's next-best capacity"))
    return True


def _worth_retrying(c: _Change, run: Run, error: str) -> bool:
    """Retry a failed run only if another try could go differently: not when it failed before
    its first training step (building the model, data or layout fails the same way every
    time), not when the same error ends a run at the same step twice, and not past
    training.max_restarts."""
    failed_at = max(run.progress_step, c.job.progress.step)
    previous, c.last_failure = c.last_failure, (error, failed_at)
    if run.progress_step < 0 or previous == (error, failed_at):
        return False
    return c.job.restarts < c.job.spec.training.max_restarts


def _finish(c: _Change, run: Run, error: str | None) -> None:
    job = c.job
    job.finished_at = c.now
    if error is None:
        assert run.result is not None
        job.result = JobResult.model_validate({k: run.result[k] for k in JobResult.model_fields})
        c.move(JobState.SUCCEEDED, "finished")
    else:
        job.error = error
        c.move(JobState.FAILED, (f"failed; each worker's output is in `raytrain logs {job.id}` "
                                 f"(GET /v1/jobs/{job.id}/logs)"))
    c.end()


def _stop_overdue(c: _Change, event: StopOverdue) -> None:
    if c.run is not None:
        c.effects.append(StopRunner(hard=True, placement_group=c.run.placement_group))
        c.run = None


def _cancel(c: _Change, event: CancelRequested) -> None:
    if c.run is not None:
        # Rank 0 reads the stop in the reply to its next report and every rank leaves at the
        # same step; the run keeps its resources counted until the group is gone.
        grace = CANCEL_GRACE_S if c.run.placement_group else CANCEL_STARTING_GRACE_S
        c.set_run(stop_by=c.now + grace)
    c.job.finished_at = c.now
    c.move(JobState.CANCELLED, "cancelled by request")
    c.end()


def _reviewed(c: _Change, event: Reviewed) -> None:
    if c.run is None:
        return
    c.set_run(reviewed_at=c.now)
    if event.decision is None:
        return
    c.job.decisions.append(event.decision)
    if event.resources is not None:
        c.job.resources = event.resources
    c.set_run(moving_to=event.moving_to)
    c.job.message = f"moving to {event.moving_to} at a checkpoint: {event.decision.reason}"
    c.save = True


def _service_restarted(c: _Change, event: ServiceRestarted) -> None:
    was = c.job.state
    if was.is_terminal:
        return
    if was in (JobState.RUNNING, JobState.RECOVERING, JobState.PROVISIONING) \
            and c.job.started_at is not None:
        c.job.restarts += 1
    c.run = None
    enter(c.job, JobState.PENDING, f"the service restarted while the job was {was.value}; "
          "it resumes from its latest checkpoint")
    c.save = True  # the stream of a reloaded job starts from its record


def _service_stopping(c: _Change, event: ServiceStopping) -> None:
    if c.run is not None:
        c.effects.append(StopRunner(hard=True, placement_group=c.run.placement_group))
        c.run = None
    if not c.job.state.is_terminal:
        c.job.message = "the service stopped; the job resumes from its checkpoint on restart"
        c.save = True


_FOR_WAITING = (Queued, Passed, CapacityDecided, Launched)
_DECISIONS = (*_FOR_WAITING, Reviewed, ServiceRestarted)
_HANDLERS: dict[type, Callable[[Any, Any], Any]] = {
    Submitted: _submitted, Queued: _queued, Passed: _passed,
    CapacityDecided: _capacity_decided, Launched: _launched, GroupStarted: _group_started,
    ProgressReported: _progress, CheckpointCommitted: _checkpoint, FinalReport: _final_report,
    RunEnded: _run_ended, StopOverdue: _stop_overdue, CancelRequested: _cancel,
    Reviewed: _reviewed, ServiceRestarted: _service_restarted,
    ServiceStopping: _service_stopping,
}
