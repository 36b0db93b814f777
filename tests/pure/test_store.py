"""Job records survive a reopened store."""

from __future__ import annotations

from pathlib import Path

from raytrain.serve.jobs.store import JobStore
from raytrain.spec import JobSpec, JobState, JobStatus


def test_records_survive_reopening(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    first = JobStatus(id="a", state=JobState.PENDING, spec=JobSpec(), created_at=1.0)
    second = JobStatus(id="b", state=JobState.RUNNING, spec=JobSpec(), created_at=2.0)
    store.put(first)
    store.put(second)
    second.state = JobState.SUCCEEDED
    store.put(second)
    store.close()
    reopened = JobStore(tmp_path / "jobs.db").load_all()
    assert [(j.id, j.state) for j, _ in reopened] == [("a", JobState.PENDING),
                                                       ("b", JobState.SUCCEEDED)]


def test_event_numbers_only_grow_and_deleted_records_go(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    job = JobStatus(id="a", state=JobState.RUNNING, spec=JobSpec(), created_at=1.0)
    store.put(job, next_event_seq=40)
    store.put(job, next_event_seq=12)  # an older writer cannot move the number back
    store.put(JobStatus(id="b", state=JobState.PENDING, spec=JobSpec(), created_at=2.0))
    store.delete("b")
    store.close()
    assert [(j.id, seq) for j, seq in JobStore(tmp_path / "jobs.db").load_all()] == [("a", 40)]
