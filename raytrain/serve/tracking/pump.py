"""The job manager's side of experiment tracking: one thread that sends each tracked job's
new history to its trackers (raytrain.serve.tracking.metrics says what), off every training
step's path and outside the manager's lock, once per job (never once per rank).

Each tracker's run and cursor are kept with the job's record (`JobStatus.tracking`,
through the lifecycle's TrackingNoted), so a job that restarts, resumes from a checkpoint,
loses a replica group or is picked up by a restarted service continues the same run. A
tracker that is down, slow or refusing is tried again with backoff (2 s, doubling to 5
minutes); the job's status carries a warning meanwhile, and what it missed is sent when it
answers (the cursor moves only when a write is taken). A resumed job (`raytrain resume`)
starts a new run, tagged with the run of the job it resumes.

Credentials are read from the service's environment and, over it, the operator's file
(`tracking_credentials_file`, KEY=VALUE lines) when a tracker is made; they are handed to
the tracker's client and go nowhere else.

    pump = TrackingPump(manager, make_tracker).start()
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from raytrain.core import lifecycle as lc
from raytrain.serve.tracking.metrics import Metric, ended, metrics_after, tags_of
from raytrain.spec import JobSpec, JobStatus
from raytrain.spec.tracking import TrackedRun, TrackingSpec, TrackingState

logger = logging.getLogger(__name__)

CREDENTIAL_KEYS = ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
                   "MLFLOW_TRACKING_PASSWORD")
FIRST_RETRY_S, LAST_RETRY_S = 2.0, 300.0


class Tracker(Protocol):
    name: str

    def open(self, job: JobStatus, run: TrackedRun, resumes: str | None) -> TrackedRun: ...

    def log(self, run: TrackedRun, metrics: list[Metric]) -> None: ...

    def tag(self, run: TrackedRun, tags: Mapping[str, str]) -> None: ...

    def end(self, run: TrackedRun, status: str, at: float) -> None: ...

    def upload(self, run: TrackedRun, folder: Path, name: str) -> bool: ...

    def close(self) -> None: ...


MakeTracker = Callable[[str, str, TrackingSpec, Mapping[str, str]], Tracker]


def credentials(file: str | None) -> dict[str, str]:
    """The trackers' credentials: the service's environment, then the operator's file."""
    found = {key: os.environ[key] for key in CREDENTIAL_KEYS if os.environ.get(key)}
    if file:
        for line in Path(file).expanduser().read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key.strip() in CREDENTIAL_KEYS:
                found[key.strip()] = value.strip().strip("'\"")
    return found


def tracking_of(spec: JobSpec, default: TrackingSpec | None) -> TrackingSpec | None:
    """The trackers a job's run goes to: its own, else the service's default."""
    chosen = spec.tracking if spec.tracking is not None else default
    return chosen if chosen is not None and chosen.trackers else None


def settled(job: JobStatus, tracking: TrackingSpec) -> bool:
    """Every tracker has been told how the job ended (nothing more to send)."""
    runs = job.tracking.runs if job.tracking is not None else {}
    return job.state.is_terminal and all(
        name in runs and runs[name].ended for name in tracking.trackers)


class TrackingPump:
    def __init__(self, manager: Any, make: MakeTracker, interval_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.manager, self.make, self.interval_s, self.clock = manager, make, interval_s, clock
        self._trackers: dict[tuple[str, str], Tracker] = {}
        self._opened: set[tuple[str, str]] = set()  # runs found again by this process
        self._retry: dict[tuple[str, str], tuple[float, float, str]] = {}  # due, delay, why
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TrackingPump:
        self._thread = threading.Thread(target=self._forever, name="tracking", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for tracker in self._trackers.values():
            try:
                tracker.close()
            except Exception:  # a tracker's close must not stop the service's
                logger.exception("closing a tracker failed")

    def _forever(self) -> None:
        while not self._stopping.is_set():
            try:
                self.pass_once()
            except Exception:  # keep tracking whatever one job did
                logger.exception("tracking pass failed")
            self._stopping.wait(self.interval_s)

    def pass_once(self) -> None:
        """Send every tracked job's news to its trackers."""
        default = self.manager.config.tracking
        with self.manager.lock:
            jobs = []
            for job_id, record in self.manager.records.items():
                status = record.status
                tracking = tracking_of(status.spec, default)
                if tracking is not None and not settled(status, tracking):
                    jobs.append((job_id, status, tracking))
        for job_id, status, tracking in jobs:
            self._job(job_id, status, tracking)

    def _job(self, job_id: str, job: JobStatus, tracking: TrackingSpec) -> None:
        state = job.tracking or TrackingState()
        runs = dict(state.runs)
        after = min((runs[n].sent_step if n in runs else -1) for n in tracking.trackers)
        text = self.manager.history(job_id, after_step=after)
        if text is None:  # deleted meanwhile
            return
        history = json.loads(text)
        problems = []
        for name in tracking.trackers:
            key = (job_id, name)
            retry = self._retry.get(key)
            if retry is not None and self.clock() < retry[0]:
                problems.append(retry[2])
                continue
            try:
                runs[name] = self._send(key, job, tracking, runs.get(name, TrackedRun()),
                                        history, state.resumes_run.get(name))
                self._retry.pop(key, None)
            except Exception as exc:  # noqa: BLE001 - any tracker failure: retried, never the job's
                delay = min(LAST_RETRY_S, retry[1] * 2) if retry else FIRST_RETRY_S
                why = f"{name}: {exc}; retrying every {delay:.0f} s at most, and sending " \
                      "what it missed when it answers"
                self._retry[key] = (self.clock() + delay, delay, why)
                problems.append(why)
                if retry is None:
                    logger.warning("job %s: %s", job_id, why)
        new = state.model_copy(update={"runs": runs, "warning": "; ".join(problems) or None})
        if new != state:
            with self.manager.lock:
                if job_id in self.manager.records:
                    self.manager.apply(job_id, lc.TrackingNoted(new))
        if job.state.is_terminal and all(runs.get(n, TrackedRun()).ended
                                         for n in tracking.trackers):
            for name in tracking.trackers:  # settled: its clients go
                tracker = self._trackers.pop((job_id, name), None)
                if tracker is not None:
                    tracker.close()

    def _send(self, key: tuple[str, str], job: JobStatus, tracking: TrackingSpec,
              run: TrackedRun, history: dict[str, Any], resumes: str | None) -> TrackedRun:
        tracker = self._trackers.get(key)
        if tracker is None:
            secrets = credentials(self.manager.config.tracking_credentials_file)
            tracker = self._trackers[key] = self.make(key[1], key[0], tracking, secrets)
        if key not in self._opened:  # made, or found again (and its cursor checked)
            run = tracker.open(job, run, resumes)
            self._opened.add(key)
        metrics, cursor = metrics_after(history, run)
        if metrics:
            tracker.log(run, metrics)
        run = run.model_copy(update={"sent_step": cursor.sent_step,
                                     "sent_report": cursor.sent_report,
                                     "sent_val_step": cursor.sent_val_step})
        if run.sent_state != job.state.value:
            tracker.tag(run, tags_of(job))
            run = run.model_copy(update={"sent_state": job.state.value})
        status = ended(job.state)
        if status is not None and history.get("next_after_step") is None and not run.ended:
            exported = self.manager.exported_folder(job.id)
            if exported is not None and not tracker.upload(run, exported, "model"):
                tracker.tag(run, {"raytrain.model": str(exported)})
            tracker.end(run, status, job.finished_at or self.clock())
            run = run.model_copy(update={"ended": True})
        return run
