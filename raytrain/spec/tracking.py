"""`tracking:`: where a job's run is logged besides raytrain's own history (MLflow, Weights &
Biases, TensorBoard), and what the service keeps of it (`TrackingState`, with the job's
record, so a restarted service continues the same runs).

    tracking: {mlflow: {tracking_uri: http://mlflow:5000, experiment: llama-sft},
               wandb: {project: llama, mode: offline}, tensorboard: {}}

No secret is part of a spec: credentials come from the service's environment or the file its
operator names (`ServiceConfig.tracking_credentials_file`).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from raytrain.spec._base import Record, Strict


class MlflowSpec(Strict):
    tracking_uri: str = Field(max_length=1024, description=(
        "The MLflow tracking server, http(s)://HOST[:PORT][/PATH]. Its credentials "
        "(MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD) "
        "come from the service's environment or its tracking_credentials_file."))
    experiment: str = Field("raytrain", min_length=1, max_length=500,
                            description="The experiment the run goes in (made if missing).")

    @field_validator("tracking_uri")
    @classmethod
    def _a_server_without_secrets(cls, uri: str) -> str:
        parts = urlsplit(uri)
        _ = parts.port  # a port that is not a number raises here
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL of an MLflow tracking server. To fix: "
                             "give e.g. http://mlflow.internal:5000")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials. To fix: remove them from the URL "
                             "and give the service MLFLOW_TRACKING_USERNAME and "
                             "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in its "
                             "environment or tracking_credentials_file")
        return uri.rstrip("/")


class WandbSpec(Strict):
    project: str = Field(min_length=1, max_length=128, description="The W&B project.")
    entity: str | None = Field(None, max_length=128, description="The team or user (default: "
                               "the API key's).")
    mode: Literal["online", "offline"] = Field("online", description=(
        "'online': sent to W&B (WANDB_API_KEY from the service's environment or its "
        "tracking_credentials_file); 'offline': run files in the service's state folder, "
        "for `wandb sync` later."))


class TensorboardSpec(Strict):
    """Event files under the job's storage folder, `tensorboard/` (a bucket's too)."""


class TrackingSpec(Strict):
    """Trackers that get the job's run: its parameters, every step's metrics, its state."""

    mlflow: MlflowSpec | None = Field(None, description="An MLflow run per job.")
    wandb: WandbSpec | None = Field(None, description="A Weights & Biases run per job.")
    tensorboard: TensorboardSpec | None = Field(
        None, description="TensorBoard event files in the job's storage.")

    @property
    def trackers(self) -> list[str]:
        return [name for name in ("mlflow", "wandb", "tensorboard")
                if getattr(self, name) is not None]


class TrackedRun(Record):
    """One tracker's run of a job."""

    run_id: str | None = Field(None, description="The tracker's id of the run.")
    url: str | None = Field(None, description="Where to see it (a folder, for TensorBoard).")
    artifact_uri: str | None = Field(None, description="Where the tracker keeps its files.")
    ended: bool = Field(False, description="The tracker was told how the job ended.")
    sent_step: int = Field(-1, description="The last step whose metrics the tracker took.")
    sent_report: float = Field(0.0, description="The time of the last progress report it "
                               "took (tokens/s, MFU, dollars, validation loss).")
    sent_val_step: int = Field(-1, description="The step of the last validation loss it "
                               "took.")
    sent_state: str | None = Field(None, description="The job state it was last told.")


class TrackingState(Record):
    """What the service keeps of a job's tracking, with its record."""

    runs: dict[str, TrackedRun] = Field(default_factory=dict,
                                        description="Each tracker's run, by tracker.")
    warning: str | None = Field(None, description="A tracker that does not take the run's "
                                "metrics: retried, and sent what it missed when it answers.")
    resumes_run: dict[str, str] = Field(default_factory=dict, description=(
        "A resumed job's: the run of the job it resumes, by tracker (its new run links it)."))
