"""What a job's trackers are sent (raytrain.serve.tracking.metrics), where their credentials
come from, and the tracking section's checks: plain values."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from raytrain.serve.tracking.metrics import metrics_after
from raytrain.serve.tracking.pump import credentials, tracking_of
from raytrain.spec import JobSpec
from raytrain.spec.tracking import TrackedRun, TrackingSpec


def _history() -> dict:
    steps = [{"step": s, "loss": 5.0 - s / 10, "lr": 1e-3, "grad_norm": 0.5, "tokens": 64}
             for s in range(1, 7)]
    points = [{"time": 100.0 + s, "step": s, "tokens_per_s": 10.0 * s, "mfu": 0.3,
               "cost_usd": 0.01 * s, "usd_per_hour": 1.0,
               "val_loss": 2.0 if s >= 4 else None, "val_step": 4 if s >= 4 else None}
              for s in (2, 4, 6)]
    return {"steps": steps, "points": points}


def test_every_step_once_and_each_report_at_its_step() -> None:
    metrics, cursor = metrics_after(_history(), TrackedRun())
    by = {(m.key, m.step): m for m in metrics}
    assert sorted(s for k, s in by if k == "loss") == [1, 2, 3, 4, 5, 6]
    assert sorted(s for k, s in by if k == "tokens_per_s") == [2, 4, 6]
    assert [s for k, s in by if k == "val_loss"] == [4]  # carried by two reports, sent once
    assert by[("loss", 3)].time == 104.0  # the report that carried it
    assert (cursor.sent_step, cursor.sent_report, cursor.sent_val_step) == (6, 106.0, 4)
    assert [m.step for m in metrics] == sorted(m.step for m in metrics)


def test_a_cursor_sends_only_what_came_after_it() -> None:
    run = TrackedRun(sent_step=4, sent_report=104.0, sent_val_step=4)
    metrics, cursor = metrics_after(_history(), run)
    assert {(m.key, m.step) for m in metrics} >= {("loss", 5), ("loss", 6),
                                                  ("tokens_per_s", 6)}
    assert all(m.step > 4 for m in metrics)
    assert cursor.sent_step == 6
    again, same = metrics_after(_history(), run.model_copy(update={
        "sent_step": 6, "sent_report": 106.0, "sent_val_step": 4}))
    assert again == [] and same.sent_step == 6


def test_credentials_come_from_the_environment_then_the_operators_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "from-env")
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "env-token")
    monkeypatch.setenv("UNRELATED", "x")
    file = tmp_path / "trackers.env"
    file.write_text("MLFLOW_TRACKING_TOKEN='file-token'\n# a comment\nOTHER=1\n")
    assert credentials(None) == {"WANDB_API_KEY": "from-env",
                                 "MLFLOW_TRACKING_TOKEN": "env-token"}
    assert credentials(str(file)) == {"WANDB_API_KEY": "from-env",
                                      "MLFLOW_TRACKING_TOKEN": "file-token"}


def test_a_tracking_uri_with_credentials_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate({"tracking": {"mlflow": {
            "tracking_uri": "https://me:pw@mlflow.example.com"}}})
    assert refused.value.errors()[0]["loc"] == ("tracking", "mlflow", "tracking_uri")
    assert "MLFLOW_TRACKING_PASSWORD" in str(refused.value)
    with pytest.raises(ValidationError):
        JobSpec.model_validate({"tracking": {"mlflow": {"tracking_uri": "mlflow.example"}}})
    with pytest.raises(ValidationError):  # no field for a key
        JobSpec.model_validate({"tracking": {"wandb": {"project": "p", "api_key": "k"}}})


def test_a_job_without_trackers_takes_the_services_default() -> None:
    default = TrackingSpec.model_validate({"tensorboard": {}})
    own = JobSpec.model_validate({"tracking": {"wandb": {"project": "p"}}})
    assert tracking_of(JobSpec(), default) == default
    assert tracking_of(own, default) == own.tracking
    assert tracking_of(JobSpec(), None) is None
    assert tracking_of(JobSpec.model_validate({"tracking": {}}), default) is None  # off


def test_raytrain_status_links_each_run_and_says_why_one_lags() -> None:
    import io

    from rich.console import Console

    from raytrain.cli.views import status_table
    from raytrain.spec import JobStatus
    from tests.support.service import small_job

    url = "http://mlflow.internal:5000/#/experiments/1/runs/abc"
    job = JobStatus.model_validate({
        "id": "j", "state": "RUNNING", "spec": small_job(), "created_at": 0.0,
        "tracking": {"runs": {"mlflow": {"run_id": "abc", "url": url}},
                     "warning": "wandb: did not answer; retrying"}})
    drawn = io.StringIO()
    Console(file=drawn, width=200).print(status_table(job))
    assert url in drawn.getvalue() and "did not answer; retrying" in drawn.getvalue()
