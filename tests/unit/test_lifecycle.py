"""The job lifecycle with plain values: every allowed move, every forbidden one, and random
sequences of moves."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytrain.core.lifecycle import HOLDS, TRANSITIONS, allowed, enter
from raytrain.errors import IllegalTransition
from raytrain.spec import JobSpec, JobState, JobStatus

ENDS = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}


def job_in(state: JobState) -> JobStatus:
    return JobStatus(id="ab12", state=state, spec=JobSpec(), created_at=1.0)


@pytest.mark.parametrize("old", list(JobState))
@pytest.mark.parametrize("new", list(JobState))
def test_each_move_is_allowed_or_refused_by_the_table(old: JobState, new: JobState) -> None:
    job = job_in(old)
    if allowed(old, new):
        enter(job, new, "because")
        assert job.state == new
        assert job.message == (None if new in (JobState.RUNNING, JobState.SUCCEEDED)
                               else "because")
    else:
        with pytest.raises(IllegalTransition, match=f"from {old.value} to {new.value}"):
            enter(job, new, "because")
        assert job.state == old


def test_an_ended_job_never_moves_and_every_move_names_its_reason() -> None:
    for end in ENDS:
        assert TRANSITIONS[end] == frozenset() and HOLDS[end] == ()
    with pytest.raises(ValueError):
        enter(job_in(JobState.PENDING), JobState.PROVISIONING, "")
    # the forward path and the recovery loop are all allowed
    path = [JobState.PENDING, JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING,
            JobState.RUNNING, JobState.SUCCEEDED]
    assert all(allowed(a, b) for a, b in zip(path, path[1:]))


@given(st.lists(st.sampled_from(list(JobState)), max_size=30))
def test_random_requests_only_move_along_the_table(requests: list[JobState]) -> None:
    job, seen = job_in(JobState.PENDING), [JobState.PENDING]
    for wanted in requests:
        before = job.state
        try:
            enter(job, wanted, "requested")
        except IllegalTransition:
            assert job.state == before
            continue
        assert wanted in TRANSITIONS[before]
        seen.append(job.state)
    ended = [i for i, state in enumerate(seen) if state in ENDS]
    assert not ended or ended[0] == len(seen) - 1  # nothing after the end
