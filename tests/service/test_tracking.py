"""A job's run in a real MLflow tracking server on 127.0.0.1 (`mlflow server`, read back
through its REST API), sent by the job manager from the reports rank 0 makes (the manager's
own methods, called as the workers call them; the cluster is the recording fake): every
step's loss, learning rate and gradient norm equal the job's own history; a service
restarted mid-job goes on with the same run; the server stopped mid-job leaves the job
running with a warning in its status, and the steps of the outage arrive once it is back;
the run ends FINISHED when the job SUCCEEDED, its exported folder the run's `model`. No
credential shows in a status, an event or the service's log."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from raytrain.testing.mlflow_server import MlflowServer
from tests.support.service import Service, result, small_job

pytest.importorskip("mlflow")

SECRET = "s3cr3t-token-planted-by-the-test"
LATE_VAL_LOSS = 3.25


def _report(step: int) -> dict[str, Any]:
    """Rank 0's report after `step`, carrying that step's row."""
    loss = 5.0 - step / 50
    return {"step": step, "total_steps": 30, "loss": loss, "first_loss": 4.98,
            "tokens_per_s": 1000.0 + step, "elapsed_s": float(step), "eta_s": 30.0 - step,
            "sent_at": 0.0, "steps": [[step, loss, 1e-3 * step, 0.5 + step / 100, 2048]]}


def _train(service: Service, job_id: str, steps: range, resumed: int,
           validation_at: int | None = None) -> int:
    """Rank 0's start and reports; from `validation_at` on, they carry its validation loss."""
    attempt = service.manager.worker_group_started(
        job_id, resumed, {"placement_group": "pg-1", "accelerator": "cpu", "nodes": 1})
    for step in steps:
        service.cluster.advance(1.0)
        validated = validation_at is not None and step >= validation_at
        service.manager.report_progress(job_id, attempt, {
            **_report(step), **({"val_loss": 4.5, "val_step": validation_at}
                                if validated else {})})
    return attempt


def _pump_until(service: Service, job_id: str, done: Any, timeout_s: float = 60.0
                ) -> dict[str, Any]:
    """Tracking passes until `done(status)`, as the pump's thread makes them."""
    deadline = time.monotonic() + timeout_s
    while True:
        service.manager.tracking.pass_once()
        status = service.request("GET", f"/v1/jobs/{job_id}").json()
        if done(status):
            return status
        assert time.monotonic() < deadline, status.get("tracking")
        time.sleep(0.5)


def test_a_jobs_mlflow_run_through_a_restart_and_an_outage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    caplog.set_level(logging.INFO)
    server = MlflowServer(tmp_path / "mlflow").start()
    try:
        config = {"tracking_interval_s": 600.0}  # the test makes the passes
        service = Service(tmp_path / "state", **config)
        job = {**small_job(), "tracking": {"mlflow": {"tracking_uri": server.url,
                                                      "experiment": "tracking-test"}}}
        job_id = service.request("POST", "/v1/jobs", json=job).json()["id"]
        service.tick()
        _train(service, job_id, range(1, 11), 0)
        service.manager.report_checkpoint(job_id, 1, 10, "/ckpt/10", 0.5)
        status = _pump_until(service, job_id,
                             lambda s: s["tracking"]["runs"]["mlflow"]["sent_step"] == 10)
        run = status["tracking"]["runs"]["mlflow"]
        assert run["url"].startswith(server.url) and run["run_id"] in run["url"]

        # The service is lost and a new one takes over: the same run goes on.
        service.manager.tracking.stop()
        service = Service(tmp_path / "state", cluster=service.cluster, **config)
        service.tick()
        attempt = _train(service, job_id, range(11, 21), 10, validation_at=15)
        status = _pump_until(service, job_id,
                             lambda s: s["tracking"]["runs"]["mlflow"]["sent_step"] == 20)
        assert status["tracking"]["runs"]["mlflow"]["run_id"] == run["run_id"]
        _nothing_sent_twice(service, job_id, status, server.url)

        # The server goes down: the job trains on, its status says why its run lags.
        server.stop()
        for step in range(21, 31):
            service.cluster.advance(1.0)
            service.manager.report_progress(job_id, attempt, _report(step))
        status = _pump_until(service, job_id, lambda s: s["tracking"]["warning"])
        assert "mlflow" in status["tracking"]["warning"] and status["state"] == "RUNNING"
        service.manager.report_checkpoint(job_id, attempt, 30, "/ckpt/30", 0.5)
        # where a kind 'hf' job's workers write it at its end (checkpoint_root / "hf")
        exported = Path(service.cluster.runs[job_id].checkpoint_root) / "hf"
        exported.mkdir(parents=True)
        (exported / "config.json").write_text('{"model_type": "llama"}')
        service.manager.report_finished(job_id, attempt, result(30))
        service.cluster.finish(job_id)
        service.tick()
        assert service.state(job_id) == "SUCCEEDED"

        server.start()  # back: what it missed arrives, and the run ends
        status = _pump_until(service, job_id, lambda s: s["tracking"]["runs"]["mlflow"]["ended"]
                             and not s["tracking"]["warning"])
        history = service.request("GET", f"/v1/jobs/{job_id}/history").json()["steps"]
        assert [row["step"] for row in history] == list(range(1, 31))
        for key in ("loss", "lr", "grad_norm"):
            sent = server.history(run["run_id"], key)
            assert sent == {row["step"]: [pytest.approx(row[key], rel=1e-12)]
                            for row in history}, key
        info = server.get("runs/get", run_id=run["run_id"])["run"]
        assert info["info"]["status"] == "FINISHED"
        tags = {t["key"]: t["value"] for t in info["data"]["tags"]}
        assert tags["raytrain.state"] == "SUCCEEDED" and tags["raytrain.job_id"] == job_id
        params = {p["key"]: p["value"] for p in info["data"]["params"]}
        assert params["training.steps"] == "60" and "plan.layout" in params
        assert sorted(server.history(run["run_id"], "tokens_per_s")) == list(range(1, 31))
        listed = server.get("artifacts/list", run_id=run["run_id"], path="model")
        assert [f["path"] for f in listed["files"]] == ["model/config.json"]

        shown = [service.request("GET", f"/v1/jobs/{job_id}").text,
                 service.request("GET", f"/v1/jobs/{job_id}/events").text, caplog.text]
        assert not any(SECRET in text for text in shown)
    finally:
        server.stop()


def _nothing_sent_twice(service: Service, job_id: str, status: dict[str, Any], url: str
                        ) -> None:
    """A service killed after MLflow took steps 11-20 (their reports and a validation loss
    included) and before it saved its cursor: the run opened again with the cursor of step
    10 has nothing left to send (it fails with the cursor left where the record had it)."""
    from raytrain.serve.tracking.metrics import metrics_after
    from raytrain.serve.tracking.mlflow_rest import MlflowTracker
    from raytrain.spec import JobStatus
    from raytrain.spec.tracking import MlflowSpec, TrackedRun

    run = TrackedRun.model_validate(status["tracking"]["runs"]["mlflow"])
    history = service.request("GET", f"/v1/jobs/{job_id}/history").json()
    assert run.sent_step == 20 and run.sent_val_step == 15
    stale = run.model_copy(update={"sent_step": 10, "sent_report": 0.0, "sent_val_step": -1})
    assert metrics_after(history, stale)[0]  # what a stale cursor would send again
    tracker = MlflowTracker(MlflowSpec(tracking_uri=url, experiment="tracking-test"),
                            {"MLFLOW_TRACKING_TOKEN": SECRET})
    try:
        reopened = tracker.open(JobStatus.model_validate(status), stale, None)
    finally:
        tracker.close()
    assert metrics_after(history, reopened)[0] == []


def _tracked_job(service: Service, tracking: dict[str, Any]) -> tuple[str, list[dict]]:
    """A job with `tracking` trained 12 steps to SUCCEEDED, every tracking pass made; its
    history's step rows. A validation loss measured after step 6 arrives once the tracker
    has taken step 12 (a late point)."""
    job_id = service.request("POST", "/v1/jobs", json={**small_job(),
                                                       "tracking": tracking}).json()["id"]
    service.tick()
    attempt = _train(service, job_id, range(1, 13), 0)
    service.manager.tracking.pass_once()
    service.cluster.advance(1.0)
    service.manager.report_progress(job_id, attempt, {
        **_report(12), "steps": [], "val_loss": LATE_VAL_LOSS, "val_step": 6})
    service.manager.tracking.pass_once()
    service.manager.report_checkpoint(job_id, attempt, 12, "/ckpt/12", 0.5)
    service.manager.report_finished(job_id, attempt, result(12))
    service.cluster.finish(job_id)
    service.tick()
    _pump_until(service, job_id, lambda s: all(
        run["ended"] for run in s["tracking"]["runs"].values()))
    history = service.request("GET", f"/v1/jobs/{job_id}/history").json()["steps"]
    assert [row["step"] for row in history] == list(range(1, 13))
    return job_id, history


def test_tensorboard_event_files_read_back_with_tensorboards_reader(tmp_path: Path) -> None:
    """The job's storage folder holds tensorboard/, whose scalars (TensorBoard's own event
    accumulator) are the job's history."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    service = Service(tmp_path / "state", tracking_interval_s=600.0)
    job_id, history = _tracked_job(service, {"tensorboard": {}})
    folder = Path(service.config.job_uri(job_id)) / "tensorboard"
    events = EventAccumulator(str(folder))
    events.Reload()
    for key in ("loss", "lr", "grad_norm"):
        assert {e.step: e.value for e in events.Scalars(key)} == {
            # TensorBoard stores scalars as fp32 (1.2e-7 relative)
            row["step"]: pytest.approx(row[key], rel=1e-6) for row in history}, key
    status = service.request("GET", f"/v1/jobs/{job_id}").json()
    assert status["tracking"]["runs"]["tensorboard"]["url"] == str(folder)


def test_a_wandb_offline_runs_files_hold_the_jobs_history(tmp_path: Path) -> None:
    """W&B in offline mode: the run's files (read with W&B's own record format) hold every
    step's figures."""
    pytest.importorskip("wandb")
    from tests.support.wandb_records import history as logged_history

    service = Service(tmp_path / "state", tracking_interval_s=600.0)
    job_id, history = _tracked_job(service, {"wandb": {"project": "p", "mode": "offline"}})
    status = service.request("GET", f"/v1/jobs/{job_id}").json()
    run_dir = Path(status["tracking"]["runs"]["wandb"]["url"]).parent
    [records] = list(run_dir.glob("*.wandb"))
    logged = logged_history(records)
    for key in ("loss", "lr", "grad_norm"):
        assert {step: items[key] for step, items in logged.items() if key in items} == {
            row["step"]: pytest.approx(row[key], rel=1e-12) for row in history}, key
    # At its own step, though it came after step 12 (W&B's own step drops what is below it)
    assert {step: items["val_loss"] for step, items in logged.items()
            if "val_loss" in items} == {6: LATE_VAL_LOSS}


def test_a_resumed_job_starts_a_new_run_linked_to_the_old_one(tmp_path: Path) -> None:
    """`raytrain resume` of a cancelled job: the new job's runs are its own, and name the
    runs of the job it resumes (a retried resume changes nothing)."""
    service = Service(tmp_path / "state", tracking_interval_s=600.0)
    job_id = service.request("POST", "/v1/jobs", json={
        **small_job(), "tracking": {"tensorboard": {}}}).json()["id"]
    service.tick()
    _train(service, job_id, range(1, 7), 0)
    saved = tmp_path / "ckpt" / "step_00000006"  # a committed checkpoint on shared storage
    saved.mkdir(parents=True)
    (saved / "COMMITTED").touch()
    service.manager.report_checkpoint(job_id, 1, 6, str(saved), 0.5)
    service.manager.tracking.pass_once()
    service.request("DELETE", f"/v1/jobs/{job_id}")
    service.cluster.finish(job_id)
    service.tick()
    old = _pump_until(service, job_id, lambda s: s["tracking"]["runs"]["tensorboard"]["ended"])
    for _ in range(2):  # the same request twice: one job, linked once
        new = service.request("POST", f"/v1/jobs/{job_id}/resume", json={},
                              headers={"Idempotency-Key": "k"}).json()
    assert new["tracking"]["resumes_run"] == {
        "tensorboard": old["tracking"]["runs"]["tensorboard"]["run_id"]}
    service.manager.tracking.pass_once()
    status = service.request("GET", f"/v1/jobs/{new['id']}").json()
    assert status["tracking"]["runs"]["tensorboard"]["run_id"] == new["id"] != job_id
    assert status["tracking"]["resumes_run"] == new["tracking"]["resumes_run"]
