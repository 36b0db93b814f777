"""A job's states and the moves between them: the one place a job's state is assigned.

    PENDING -> PROVISIONING -> RUNNING <-> RECOVERING -> SUCCEEDED | FAILED | CANCELLED

Every move names its reason. Moves back (to PENDING: capacity went away, the service restarted)
are allowed only from the states listed, and a job that has ended never moves again. The job
manager calls `enter` for every change of state and carries out the effects of leaving a state
that holds something (a worker group, a request for nodes) itself; what each state holds is
`HOLDS`.

    enter(job, JobState.RUNNING, "training")     # raises IllegalTransition if not allowed
"""

from __future__ import annotations

from raytrain.errors import IllegalTransition
from raytrain.spec import JobState, JobStatus

_ACTIVE = (JobState.PENDING, JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING)
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

# What a job in each state may hold, released by the move out of it.
HOLDS: dict[JobState, tuple[str, ...]] = {
    JobState.PENDING: (),
    JobState.PROVISIONING: ("node request", "worker group"),
    JobState.RUNNING: ("node request", "worker group"),
    JobState.RECOVERING: ("node request", "worker group"),
    **{end: () for end in _ENDS},
}


def allowed(old: JobState, new: JobState) -> bool:
    return new in TRANSITIONS[old]


def enter(job: JobStatus, state: JobState, reason: str) -> None:
    """Move `job` to `state` for `reason`; its message becomes the reason while it waits or
    fails (a running or finished job has none)."""
    if not reason:
        raise ValueError("every move of a job's state names its reason")
    if not allowed(job.state, state) and not (job.state == state == JobState.PENDING):
        raise IllegalTransition(job.id, job.state.value, state.value)
    job.state = state
    job.message = None if state in (JobState.RUNNING, JobState.SUCCEEDED) else reason
