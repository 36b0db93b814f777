"""Experiment tracking: each job's run in MLflow, Weights & Biases and TensorBoard, sent by
the job manager (pump.py) from the history it already keeps; metrics.py says what is sent,
one module per tracker how."""

from __future__ import annotations

import importlib.util
from typing import Mapping

import httpx

from raytrain.errors import FieldError, SpecError
from raytrain.serve.tracking.pump import MakeTracker, Tracker, credentials, tracking_of
from raytrain.spec import JobSpec, ServiceConfig
from raytrain.spec.tracking import TrackingSpec

PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard"}


def tracker_factory(config: ServiceConfig) -> MakeTracker:
    """How the service makes a job's tracker of each kind."""
    def make(name: str, job_id: str, tracking: TrackingSpec,
             credentials: Mapping[str, str]) -> Tracker:
        if name == "mlflow" and tracking.mlflow is not None:
            from raytrain.serve.tracking.mlflow_rest import MlflowTracker

            return MlflowTracker(tracking.mlflow, credentials)
        if name == "wandb" and tracking.wandb is not None:
            from raytrain.serve.tracking.wandb_runs import WandbTracker

            return WandbTracker(tracking.wandb, credentials,
                                config.state_path / "tracking" / "wandb")
        if name == "tensorboard":
            from raytrain.serve.tracking.tensorboard_files import TensorboardTracker

            return TensorboardTracker(config.job_uri(job_id),
                                      config.state_path / "tracking" / "tensorboard" / job_id)
        raise ValueError(f"no tracker {name!r}")
    return make


def check_trackers(spec: JobSpec, config: ServiceConfig) -> None:
    """Refuse at submit, naming the field and the fix, a tracker this service cannot run (its
    package missing) or whose server refuses the service's credentials. A server that does
    not answer is not refused: the job runs, and its status says the run lags."""
    tracking = tracking_of(spec, config.tracking)
    if tracking is None:
        return
    errors = [FieldError(("tracking", name), f"this service has no {package} package. To "
                         "fix: pip install 'raytrain[tracking]' on the head node, or remove "
                         f"tracking.{name}")
              for name, package in PACKAGES.items()
              if name in tracking.trackers and importlib.util.find_spec(package) is None]
    if tracking.mlflow is not None:
        from raytrain.serve.tracking.mlflow_rest import MlflowTracker

        try:
            client = MlflowTracker(tracking.mlflow,
                                   credentials(config.tracking_credentials_file), timeout_s=3.0)
        except (httpx.InvalidURL, ValueError) as exc:  # what the spec's check let through
            raise SpecError([FieldError(("tracking", "mlflow", "tracking_uri"), (
                f"is not a URL the service can reach ({exc}). To fix: give e.g. "
                "http://mlflow.internal:5000"))]) from None
        try:
            refused = client.refuses_credentials()
        finally:
            client.close()
        if refused:
            errors.append(FieldError(("tracking", "mlflow", "tracking_uri"), (
                f"{tracking.mlflow.tracking_uri} refuses the service's credentials "
                f"({refused}). To fix: give the service MLFLOW_TRACKING_TOKEN, or "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, that it accepts")))
    if errors:
        raise SpecError(errors)
