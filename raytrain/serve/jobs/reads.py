"""What the job manager answers without changing a job: the list and each status (JSON text
encoded once per change), the changes the HTTP replicas' copies follow, progress points,
events, workers' output, metrics and readiness. JobManager (serve/jobs/manager.py) is one of
these; its writes are there.

    class JobManager(JobReads): ...
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import Any

from raytrain.cloud.object_store import join
from raytrain.core import lifecycle as lc
from raytrain.core.tally import Tally, snapshot
from raytrain.errors import JobNotFoundError, ServiceUnavailableError, StoreError
from raytrain.serve.jobs.durable import RETRY_AFTER_S, DurableRecords
from raytrain.serve.jobs.event_log import EventLog
from raytrain.serve.jobs.history import STEPS_PER_ANSWER, History
from raytrain.serve.jobs.versions import Versions, list_cursor
from raytrain.spec import JobStatus, ServiceConfig
from raytrain.train.worker_logs import read_stored_logs


class JobReads:
    """The reads of JobManager, over the state it keeps (set by JobManager.__init__)."""

    config: ServiceConfig
    cluster: Any
    lock: threading.RLock
    _changed: threading.Condition
    records: dict[str, lc.Record]
    tally: Tally
    _store: DurableRecords
    _encoded: dict[str, str]
    _versions: Versions
    _events: dict[str, EventLog]
    _history: History

    def list_jobs(self, limit: int | None = None, after: str | None = None,
                  states: list[str] | None = None) -> dict[str, Any]:
        """Jobs oldest first as a JSON array (text): at most `limit` of them after the cursor
        `after` (the previous page's `next`), only in `states` if given; `next` is None on
        the last page."""
        with self.lock:
            jobs = sorted((r.status for r in self.records.values()
                           if not states or r.status.state.value in states), key=_cursor)
            if after:
                jobs = [job for job in jobs if _cursor(job) > after]
            page = jobs if limit is None else jobs[:limit]
            more = limit is not None and len(jobs) > limit
            return {"jobs": "[" + ",".join(self._json(job.id) for job in page) + "]",
                    "next": _cursor(page[-1]) if more else None}

    def get_job(self, job_id: str) -> str | None:
        """The job's status as JSON text; None for no such job."""
        with self.lock:
            return self._json(job_id) if job_id in self.records else None

    def changes(self, epoch: str | None, since: int, timeout_s: float) -> dict[str, Any]:
        """serve.jobs.versions.Versions.changes over the statuses as JSON text (None: deleted),
        waiting up to timeout_s for a change after `since`."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while not self._versions.changed(epoch, since) and \
                    self._changed.wait(max(0.0, deadline - time.monotonic())):
                pass
            return self._versions.changes(epoch, since, self.records, self._json)

    def history(self, job_id: str, after_step: int = -1,
                max_steps: int = STEPS_PER_ANSWER) -> str | None:
        """The job's progress points and step rows as JobHistory's JSON text; None for no
        such job."""
        with self.lock:
            return self._history.json(job_id, after_step, max_steps) \
                if job_id in self.records else None

    def _json(self, job_id: str) -> str:
        """A job's status as JSON, encoded once per change (reads far outnumber changes)."""
        text = self._encoded.get(job_id)
        if text is None:
            text = self._encoded[job_id] = self.records[job_id].status.model_dump_json()
        return text

    def metrics(self) -> dict[str, Any]:
        """What /metrics shows: the tally, and each job's series while it is active or
        within the retention window after it ended."""
        with self.lock:
            return snapshot(self.tally, [r.status for r in self.records.values()],
                            self.cluster.now(), self.config.metrics_retention_s)

    def ready(self) -> dict[str, Any]:
        """Readiness: this actor answers, its scheduler runs, and its store takes a real
        write now, with nothing waiting to be written."""
        with self.lock:
            why = self._store.writable()
        answer = {"ready": why is None, "status": why or "ready", "jobs": len(self.records),
                  "store": str(self._store.db.path)}
        if self._store.mirror is not None:
            answer["storage"] = str(self._store.mirror)
            answer["storage_status"] = self._store.mirror_degraded or "ok"
        return answer

    def logs(self, job_id: str, offsets: dict[int, int] | None, rank: int | None,
             max_bytes: int) -> dict[str, Any]:
        """Each worker's output, by rank, from the given offsets (default: the tail)."""
        with self.lock:
            state = self._record(job_id).status.state.value
        try:
            chunks = read_stored_logs(join(self.config.job_uri(job_id), "logs"), offsets, rank,
                                      max_bytes)
        except StoreError as exc:
            raise ServiceUnavailableError(str(exc), RETRY_AFTER_S) from None
        return {"job_id": job_id, "state": state, "ranks": [asdict(chunk) for chunk in chunks]}

    def _record(self, job_id: str) -> lc.Record:
        """The job's record (the caller holds the lock); JobNotFoundError if there is none."""
        record = self.records.get(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        return record

    def wait_events(self, job_id: str, after_seq: int,
                    timeout_s: float) -> list[dict[str, Any]] | None:
        """Events with seq > after_seq, waiting up to timeout_s for one; None for no such job."""
        deadline = time.monotonic() + timeout_s  # a real wait, whatever the cluster's clock
        with self.lock:
            while True:
                log = self._events.get(job_id)
                if log is None:
                    return None
                if not log.events:  # a record reloaded after a restart has no history
                    return log.replay(self.records[job_id].status, self.cluster.now())
                fresh = log.after(after_seq)
                if fresh:
                    return fresh
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._changed.wait(remaining)


def _cursor(job: JobStatus) -> str:
    return list_cursor(job.created_at, job.id)
