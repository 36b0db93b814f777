"""A run's last steps reach the job's history before its end is visible: the manager's
actor takes calls on many threads, so rank 0's last progress report (fire-and-forget, with
the rows of the steps since the one before) can be applied after its end. The end waits for
it. Deterministic: the last report is held back while the end arrives, on the manager's own
methods, called as the workers call them (the cluster is the recording fake). It fails with
report_finished applying the end at once."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.support.service import Service, progress, result, small_job

STEPS = 40


def _report(step: int) -> dict[str, Any]:
    return {**progress(step), "total_steps": STEPS,
            "steps": [[step, 5.0 - step / 100, 1e-3, 0.5, 2048]]}


def _history_steps(service: Service, job_id: str) -> list[int]:
    rows = service.request("GET", f"/v1/jobs/{job_id}/history").json()["steps"]
    return [row["step"] for row in rows]


def _started(service: Service) -> tuple[str, int]:
    job_id = service.request("POST", "/v1/jobs", json={**small_job(), "training": {
        **small_job()["training"], "steps": STEPS}}).json()["id"]
    service.tick()
    attempt = service.manager.worker_group_started(
        job_id, 0, {"placement_group": "pg-1", "accelerator": "cpu", "nodes": 1})
    for step in range(1, 36):
        service.manager.report_progress(job_id, attempt, _report(step))
    return job_id, attempt


def _end_held_back(service: Service, job_id: str, attempt: int, end: dict[str, Any],
                   last_steps: range) -> str:
    """The end arrives first; it is not applied until the last report is."""
    ending = threading.Thread(target=service.manager.report_finished,
                              args=(job_id, attempt, end))
    ending.start()
    ending.join(0.5)
    assert ending.is_alive()  # held: the steps it ends at have not arrived
    state = service.state(job_id)
    for step in last_steps:
        service.manager.report_progress(job_id, attempt, _report(step))
    ending.join(10)
    assert not ending.is_alive()
    return state


def test_a_jobs_end_waits_for_its_last_steps(tmp_path: Path) -> None:
    service = Service(tmp_path / "state")
    job_id, attempt = _started(service)
    before = _end_held_back(service, job_id, attempt, result(STEPS), range(36, STEPS + 1))
    assert before == "RUNNING"
    service.cluster.finish(job_id)
    service.tick()
    assert service.state(job_id) == "SUCCEEDED"
    assert _history_steps(service, job_id) == list(range(1, STEPS + 1))


def test_a_cancelled_jobs_history_holds_the_step_it_stopped_at(tmp_path: Path) -> None:
    service = Service(tmp_path / "state")
    job_id, attempt = _started(service)
    assert service.request("DELETE", f"/v1/jobs/{job_id}").status_code == 200
    _end_held_back(service, job_id, attempt, {**result(38), "stopped": True}, range(36, 39))
    service.cluster.finish(job_id)
    service.tick()
    assert service.state(job_id) == "CANCELLED"
    assert _history_steps(service, job_id) == list(range(1, 39))


def test_an_end_whose_last_report_never_comes_is_applied_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    service = Service(tmp_path / "state")
    job_id, attempt = _started(service)
    caplog.set_level(logging.WARNING)
    service.manager.report_finished(job_id, attempt, result(STEPS), wait_s=0.2)
    service.cluster.finish(job_id)
    service.tick()
    assert service.state(job_id) == "SUCCEEDED"
    assert "did not arrive" in caplog.text
