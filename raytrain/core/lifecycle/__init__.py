"""A job's life as one pure function: `step(record, event, now) -> Outcome(record, effects,
reply)`. This package is the only place a job's state is assigned (values.enter): values.py
holds the table, the record, the events and the effects; handlers.py what each event does,
groups.py what the replica groups' events do.

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

from typing import Any, Callable

from raytrain.core.lifecycle import groups
from raytrain.core.lifecycle import handlers as on
from raytrain.core.lifecycle.endings import run_ended
from raytrain.core.lifecycle.events import (
    CancelRequested,
    CapacityDecided,
    CheckpointCommitted,
    Event,
    FinalReport,
    GroupChanged,
    GroupStarted,
    Launched,
    NodesHeld,
    Passed,
    ProgressReported,
    Queued,
    Reviewed,
    RunEnded,
    ServiceRestarted,
    ServiceStopping,
    StopOverdue,
    Submitted,
    TrackingNoted,
)
from raytrain.core.lifecycle.values import (
    CANCEL_GRACE_S,
    HOLDS,
    NOTICE_GRACE_S,
    PROGRESS_SAVE_INTERVAL_S,
    TRANSITIONS,
    Change,
    Effect,
    Emit,
    Outcome,
    Rebuy,
    Record,
    ReleaseNodes,
    Replace,
    Run,
    Save,
    StopRunner,
    allowed,
    enter,
    noticed_nodes_present,
    waiting,
)

__all__ = [
    "TRANSITIONS", "HOLDS", "PROGRESS_SAVE_INTERVAL_S", "CANCEL_GRACE_S",
"NOTICE_GRACE_S", "allowed", "enter", "Run", "Record", "waiting",
    "noticed_nodes_present", "Submitted", "Queued", "Passed", "CapacityDecided", "Launched",
    "NodesHeld", "GroupStarted", "GroupChanged", "Replace", "ProgressReported",
    "CheckpointCommitted", "FinalReport", "RunEnded",
    "StopOverdue", "CancelRequested", "Reviewed", "ServiceRestarted", "ServiceStopping",
    "TrackingNoted", "Event",
    "Emit", "Save", "ReleaseNodes", "StopRunner", "Rebuy", "Effect", "Outcome", "Change", "step",
]


# ---------------------------------------------------------------------------- the function


def step(record: Record, event: Event, now: float) -> Outcome:
    """The job after `event` at unix time `now`, and what to do about it. A scheduling
    decision for a job that no longer waits, or that ended (a cancel won the race), changes
    nothing; cancelling an ended job raises IllegalTransition."""
    if isinstance(event, _FOR_WAITING) and not waiting(record) or \
            record.status.state.is_terminal and isinstance(event, _DECISIONS):
        return Outcome(record)
    change = Change(record, now)
    reply = _HANDLERS[type(event)](change, event)
    return change.outcome(reply)


_FOR_WAITING = (Queued, Passed, CapacityDecided, Launched)
_DECISIONS = (*_FOR_WAITING, NodesHeld, Reviewed, ServiceRestarted)
_HANDLERS: dict[type, Callable[[Any, Any], Any]] = {
    Submitted: on.submitted, Queued: on.queued, Passed: on.passed,
    CapacityDecided: on.capacity_decided, NodesHeld: on.nodes_held, Launched: on.launched,
    GroupStarted: on.group_started,
    ProgressReported: on.progress, CheckpointCommitted: on.checkpoint,
    GroupChanged: groups.group_changed, FinalReport: on.final_report,
    RunEnded: run_ended, StopOverdue: on.stop_overdue, CancelRequested: on.cancel,
    Reviewed: on.reviewed, ServiceRestarted: on.service_restarted,
    ServiceStopping: on.service_stopping, TrackingNoted: on.tracking_noted,
}
