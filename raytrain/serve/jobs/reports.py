"""What rank 0 of a job's run tells the job manager, and what it asks: its worker group
started, each progress report (with the steps since the last one, for the job's history),
each committed checkpoint, a replica group leaving, dying, healing or joining, the view an
elastic runner needs when a group ends, and the run's end. Each is one lifecycle event applied
under the manager's lock. JobManager (serve/jobs/manager.py) is one of these.

    class JobManager(JobReads, RunReports): ...
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from raytrain.catalog.hardware import Catalog
from raytrain.core import lifecycle as lc
from raytrain.core.resolve import measured_mfu
from raytrain.serve.jobs.history import History, step_rows

logger = logging.getLogger(__name__)

LAST_REPORT_WAIT_S = 30.0  # how long a run's end waits for its last progress report


class RunReports:
    """The reports of JobManager's runs, over the state it keeps (set by JobManager.__init__)."""

    lock: threading.RLock
    _changed: threading.Condition
    records: dict[str, lc.Record]
    _history: History
    _last_row: dict[str, int]
    hardware: Catalog

    if TYPE_CHECKING:
        def apply(self, job_id: str, event: lc.Event) -> Any: ...  # JobManager.apply

    def worker_group_started(self, job_id: str, resumed_step: int,
                             placement: dict[str, Any]) -> int:
        if job_id not in self.records:
            return -1
        attempt: int = self.apply(job_id, lc.GroupStarted(
            resumed_step, placement.get("placement_group"),
            placement.get("accelerator", "cpu"), placement.get("nodes", 1)))
        return attempt

    def report_progress(self, job_id: str, attempt: int,
                        payload: dict[str, Any]) -> dict[str, bool]:
        """Record rank 0's report; the reply tells the workers whether to stop. Its `steps`
        (every step since the last report) go to the job's history, not to its status."""
        if job_id not in self.records:
            return {"stop": True}
        rows = step_rows(payload.pop("steps", None))
        with self.lock:
            job = self.records[job_id].status
            if payload.get("tokens_per_s") and job.plan is not None:
                payload["mfu"] = measured_mfu(job.spec, payload["tokens_per_s"],
                                              job.plan.layout.world_size,
                                              job.resources.accelerator, self.hardware)
            self._history.add_steps(job_id, rows)  # written with the job's next save
            if rows:
                self._last_row[job_id] = max(self._last_row.get(job_id, 0), rows[-1][0])
            reply: dict[str, bool] = self.apply(job_id, lc.ProgressReported(attempt, payload))
            return reply

    def report_checkpoint(self, job_id: str, attempt: int, step: int, path: str,
                          save_s: float | None = None,
                          durable_s: float | None = None) -> None:
        if job_id in self.records:
            self.apply(job_id, lc.CheckpointCommitted(attempt, step, path, save_s, durable_s))

    def report_group(self, job_id: str, attempt: int, group: int, state: str,
                     nodes: list[str] | None = None, step: int = 0, notice: bool = False,
                     redone_steps: int = 0, stall_s: float | None = None) -> None:
        """A replica group of an elastic run left, died, healed or joined."""
        if job_id in self.records:
            self.apply(job_id, lc.GroupChanged(attempt, group, state, frozenset(nodes or ()),
                                               step, notice, redone_steps, stall_s))

    def run_view(self, job_id: str) -> dict[str, Any]:
        """What an elastic job's runner needs to know when one of its groups ends: the step
        reached, whether the service is stopping the run (a cancel, a move, the budget), each
        replica group's state (training, leaving, healing or gone), and the nodes a group
        left on a notice (`avoid`: a replacement placed there would die with it)."""
        with self.lock:
            record = self.records.get(job_id)
            if record is None:
                return {"step": 0, "stopping": True, "groups": {}, "avoid": []}
            job, run = record.status, record.run
            stopping = job.state.is_terminal or run is None or run.stop_by is not None or \
                run.moving_to is not None or run.over_budget
            return {"step": job.progress.step, "stopping": stopping,
                    "groups": {g.index: g.state for g in job.groups},
                    "avoid": sorted(run.noticed_nodes) if run is not None else []}

    def report_finished(self, job_id: str, attempt: int, result: dict[str, Any],
                        wait_s: float = LAST_REPORT_WAIT_S) -> None:
        """Rank 0's end of a run. Its last progress report (the last steps' rows) may still
        be on its way, on another of the actor's threads: the end is applied once the job's
        progress has reached the run's last step (at most `wait_s` later; every report's
        apply wakes the waiters of `_changed`), so that a job never reads as ended with steps
        missing from its history."""
        with self.lock:
            if job_id not in self.records:
                return
            last = int(result.get("steps") or 0)
            reached = self._changed.wait_for(
                lambda: job_id not in self.records or max(
                    self._last_row.get(job_id, 0),
                    self.records[job_id].status.progress.step) >= last, timeout=wait_s)
            if not reached:
                logger.warning("job %s ended at step %d, and its progress report of that step "
                               "did not arrive in %.0f s: its history may lack the last steps",
                               job_id, last, wait_s)
            self._last_row.pop(job_id, None)
            if job_id in self.records:
                self.apply(job_id, lc.FinalReport(attempt, result))
