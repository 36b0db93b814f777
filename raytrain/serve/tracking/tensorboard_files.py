"""TensorBoard event files for a job, `tensorboard/` in its storage folder, written with
TensorBoard's own event-file writer (scalars: each metric a tag, at its step and time; the
job's state and tags as text at the step reached). A job whose storage is a bucket has them
written in the service's state folder and put in the bucket, whole, at most once a minute
and when the job ends. A service that restarts opens a new event file in the same folder;
TensorBoard reads a folder's files as one run.

    tracker = TensorboardTracker("/data/jobs/j-1", staging=Path("~/.raytrain/tracking/j-1"))
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping

from raytrain.cloud.object_store import is_remote, join, open_store
from raytrain.serve.tracking.metrics import Metric
from raytrain.spec import JobStatus
from raytrain.spec.tracking import TrackedRun

UPLOAD_EVERY_S = 60.0


class TensorboardTracker:
    name = "tensorboard"

    def __init__(self, job_uri: str, staging: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.remote = is_remote(job_uri)
        self.target = join(job_uri, "tensorboard")
        self.folder = staging if self.remote else Path(self.target)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(self.folder), flush_secs=5)
        self._uploaded_at = 0.0

    def open(self, job: JobStatus, run: TrackedRun, resumes: str | None) -> TrackedRun:
        return run.model_copy(update={"run_id": job.id, "url": self.target})

    def log(self, run: TrackedRun, metrics: list[Metric]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        for metric in metrics:
            self.writer.add_event(Event(
                wall_time=metric.time, step=metric.step,
                summary=Summary(value=[Summary.Value(tag=metric.key,
                                                     simple_value=metric.value)])))
        self._flush(final=False)

    def tag(self, run: TrackedRun, tags: Mapping[str, str]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.text.summary_v2 import text_pb

        step = max(run.sent_step, 0)
        for key, value in tags.items():
            proto = text_pb(key, value)
            self.writer.add_event(Event(wall_time=time.time(), step=step,
                                        summary=Summary(value=list(proto.value))))
        self._flush(final=False)

    def end(self, run: TrackedRun, status: str, at: float) -> None:
        self.tag(run, {"raytrain.ended": status})
        self._flush(final=True)

    def upload(self, run: TrackedRun, folder: Path, name: str) -> bool:
        return False  # a model is not a TensorBoard artifact: the run's tag names it

    def _flush(self, final: bool) -> None:
        self.writer.flush()
        if self.remote and (final or time.monotonic() - self._uploaded_at >= UPLOAD_EVERY_S):
            store = open_store(self.target)
            for path in sorted(self.folder.iterdir()):
                store.put_file(path, path.name)
            self._uploaded_at = time.monotonic()

    def close(self) -> None:
        self._flush(final=True)
        self.writer.close()
