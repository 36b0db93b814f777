"""An MLflow run per job, over MLflow's REST API (2.0) with httpx.

Why not MLflow's Python client: it is a large install for the service (the `mlflow` package
and its server's dependencies), it reads its server and credentials from process-wide
environment variables (one server per process, where each job may name its own), and its
calls retry for minutes inside a call. The REST API is small and stable: experiments
get-by-name / create, runs create / get / update / log-batch / set-tag, and the artifact
proxy's PUT (`mlflow server` serves artifacts by default).

Credentials come from the service (MLFLOW_TRACKING_TOKEN as a bearer token, or
MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD as basic auth), never from the job.

    tracker = MlflowTracker(spec.tracking.mlflow, credentials)
    run = tracker.open(job, TrackedRun(), resumes=None)     # the run made, or found again
    tracker.log(run, metrics); tracker.tag(run, tags); tracker.end(run, "FINISHED", now)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import quote

import httpx

from raytrain.serve.tracking.metrics import REPORT_KEYS, STEP_KEYS, Metric, params_of, tags_of
from raytrain.spec import JobStatus
from raytrain.spec.tracking import MlflowSpec, TrackedRun

BATCH = 1000  # log-batch's limit on metrics + params + tags
PARAMS_PER_BATCH = 100
TAGS_PER_BATCH = 100


class TrackerError(Exception):
    """A tracker that did not take a write: unreachable, slow, or refusing (retried)."""


class MlflowTracker:
    name = "mlflow"

    def __init__(self, spec: MlflowSpec, credentials: Mapping[str, str],
                 timeout_s: float = 10.0) -> None:
        self.spec = spec
        auth: Any = None
        headers = {}
        if credentials.get("MLFLOW_TRACKING_TOKEN"):
            headers["Authorization"] = f"Bearer {credentials['MLFLOW_TRACKING_TOKEN']}"
        elif credentials.get("MLFLOW_TRACKING_USERNAME"):
            auth = (credentials["MLFLOW_TRACKING_USERNAME"],
                    credentials.get("MLFLOW_TRACKING_PASSWORD", ""))
        self.http = httpx.Client(base_url=spec.tracking_uri, headers=headers, auth=auth,
                                 timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def refuses_credentials(self) -> str | None:
        """The server's status when it refuses this client's credentials (401, 403); None
        when it takes them, or does not answer (a server down is not the job's fault)."""
        try:
            answer = self.http.get("/api/2.0/mlflow/experiments/get-by-name",
                                   params={"experiment_name": self.spec.experiment})
        except (httpx.HTTPError, httpx.InvalidURL, OSError, UnicodeError):
            return None  # no answer (a name that does not resolve included)
        return f"HTTP {answer.status_code}" if answer.status_code in (401, 403) else None

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            answer = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise TrackerError(f"MLflow at {self.spec.tracking_uri} did not answer "
                               f"({type(exc).__name__})") from None
        if answer.status_code >= 400:
            try:
                said = answer.json().get("message", "")
            except ValueError:
                said = answer.text[:200]
            raise TrackerError(f"MLflow at {self.spec.tracking_uri} refused {path} "
                               f"({answer.status_code}: {said})")
        return answer.json() if answer.content else {}

    def _experiment_id(self) -> str:
        try:
            found = self._call("GET", "/api/2.0/mlflow/experiments/get-by-name",
                               params={"experiment_name": self.spec.experiment})
            return str(found["experiment"]["experiment_id"])
        except TrackerError as exc:
            if "RESOURCE_DOES_NOT_EXIST" not in str(exc) and "404" not in str(exc):
                raise
        made = self._call("POST", "/api/2.0/mlflow/experiments/create",
                          json={"name": self.spec.experiment})
        return str(made["experiment_id"])

    def open(self, job: JobStatus, run: TrackedRun, resumes: str | None) -> TrackedRun:
        """The job's run: made (with the job's parameters and tags) if it has none yet, else
        the one it has, with its cursor moved to what MLflow holds of it (a service that
        restarted before saving its cursor sends nothing twice): the last step of the step
        metrics, the last report of the report metrics (by its time, which MLflow keeps to
        the millisecond), the last validation loss's step."""
        if run.run_id is not None:
            found = self._call("GET", "/api/2.0/mlflow/runs/get", params={"run_id": run.run_id})
            latest = found["run"].get("data", {}).get("metrics", [])
            return run.model_copy(update=held_cursor(run, latest))
        experiment = self._experiment_id()
        tags = {**tags_of(job), "mlflow.runName": f"{job.spec.name}-{job.id}",
                **({"raytrain.resumes_run": resumes, "mlflow.parentRunId": resumes}
                   if resumes else {})}
        made = self._call("POST", "/api/2.0/mlflow/runs/create", json={
            "experiment_id": experiment, "start_time": int(job.created_at * 1000),
            "run_name": f"{job.spec.name}-{job.id}",
            "tags": [{"key": k, "value": v} for k, v in tags.items()]})
        info = made["run"]["info"]
        run_id = info["run_id"]
        params = list(params_of(job).items())
        for start in range(0, len(params), PARAMS_PER_BATCH):
            self._call("POST", "/api/2.0/mlflow/runs/log-batch", json={
                "run_id": run_id, "params": [{"key": k, "value": v}
                                             for k, v in params[start:start + PARAMS_PER_BATCH]]})
        url = f"{self.spec.tracking_uri}/#/experiments/{experiment}/runs/{run_id}"
        return run.model_copy(update={"run_id": run_id, "url": url,
                                      "artifact_uri": info.get("artifact_uri")})

    def log(self, run: TrackedRun, metrics: list[Metric]) -> None:
        for start in range(0, len(metrics), BATCH):
            self._call("POST", "/api/2.0/mlflow/runs/log-batch", json={
                "run_id": run.run_id, "metrics": [
                    {"key": m.key, "value": m.value, "timestamp": int(m.time * 1000),
                     "step": m.step} for m in metrics[start:start + BATCH]]})

    def tag(self, run: TrackedRun, tags: Mapping[str, str]) -> None:
        items = list(tags.items())
        for start in range(0, len(items), TAGS_PER_BATCH):
            self._call("POST", "/api/2.0/mlflow/runs/log-batch", json={
                "run_id": run.run_id, "tags": [{"key": k, "value": v}
                                               for k, v in items[start:start + TAGS_PER_BATCH]]})

    def end(self, run: TrackedRun, status: str, at: float) -> None:
        self._call("POST", "/api/2.0/mlflow/runs/update", json={
            "run_id": run.run_id, "status": status, "end_time": int(at * 1000)})

    def upload(self, run: TrackedRun, folder: Path, name: str) -> bool:
        """The files of `folder` as the run's artifacts under `name`, through the server's
        artifact proxy (a run whose artifacts live elsewhere gets a tag naming the folder
        instead: False)."""
        prefix = "mlflow-artifacts:/"
        if not (run.artifact_uri or "").startswith(prefix):
            return False
        root = (run.artifact_uri or "")[len(prefix):].strip("/")
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            relative = path.relative_to(folder).as_posix()
            target = quote(f"{root}/{name}/{relative}")
            try:
                answer = self.http.put(f"/api/2.0/mlflow-artifacts/artifacts/{target}",
                                       content=path.read_bytes(), timeout=60.0)
            except httpx.HTTPError as exc:
                raise TrackerError(f"MLflow at {self.spec.tracking_uri} did not take an "
                                   f"artifact ({type(exc).__name__})") from None
            if answer.status_code >= 400:
                raise TrackerError(f"MLflow at {self.spec.tracking_uri} refused an artifact "
                                   f"({answer.status_code})")
        return True


def held_cursor(run: TrackedRun, latest: list[dict[str, Any]]) -> dict[str, Any]:
    """The cursor fields of `run` moved past what MLflow holds (`latest`: each metric's
    latest value, as runs/get answers: key, step, timestamp in milliseconds)."""
    def last(keys: tuple[str, ...], field: str) -> int:
        return max((int(m.get(field, -1)) for m in latest if m.get("key") in keys),
                   default=-1)

    sent_report = run.sent_report
    stamp = last(REPORT_KEYS, "timestamp")
    if stamp >= 0:  # a report was sent iff its time, in whole ms, is at most `stamp`
        sent_report = max(sent_report, math.nextafter((stamp + 1) / 1000, -math.inf))
    return {"sent_step": max(run.sent_step, last(STEP_KEYS, "step")),
            "sent_report": sent_report,
            "sent_val_step": max(run.sent_val_step, last(("val_loss",), "step"))}
