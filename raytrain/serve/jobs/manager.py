"""The job manager: one detached Ray actor on the head node that owns every job.

It validates and queues submissions, keeps one `core.lifecycle.Record` per job, and feeds the
lifecycle every request, scheduling decision and report from rank 0 as an event; it keeps the
record the lifecycle returns and carries out its effects: events on the job's stream
(serve.jobs.event_log), writes to the durable store (serve.jobs.store), withdrawing node requests
(serve.jobs.provisioning) and stopping runners (serve.adaptors.ray_cluster). Rank 0's reports are
serve.jobs.reports, its reads serve.jobs.reads; the scheduling pass is
serve.jobs.scheduler. Nothing here calls Ray or reads the time of day directly: both go through
the cluster adaptor (the Protocol serve.adaptors.cluster.Cluster), which tests replace with a
recording fake (raytrain/testing/fake_ray.py).

The actor outlives the Serve app (it is detached), so redeploying the HTTP layer loses
nothing. If the actor itself is lost, Ray starts a new one, which reloads every record from
the store, reclaims what the old one's runs held, and queues the jobs that were in flight
again; they resume from their latest checkpoint.

Methods answer typed values (a JobStatus, a page of them, a reply model) and refuse with
the exceptions of raytrain.errors, which pickle to themselves across the actor boundary; the
HTTP layer turns each into its status code (serve.http.answers).

    manager = JobManager(config.model_dump(mode="json"), cluster=RayCluster()).start()
    manager.submit(spec) -> JobStatus   # or raises SpecError, ServiceBusyError, ...
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

from pydantic import ValidationError

from raytrain.api_tokens import token_digests
from raytrain.catalog.hardware import CATALOG
from raytrain.cloud.object_store import is_remote, join, open_store
from raytrain.core import lifecycle as lc
from raytrain.core.exports import checkpoint_to_export
from raytrain.core.queue import never_fits
from raytrain.core.resolve import plan_summary
from raytrain.core.tally import Tally
from raytrain.errors import FieldError, JobStateError, ServiceUnavailableError, StoreError
from raytrain.models.factories import resolve_factory
from raytrain.serve.adaptors.cluster import Cluster
from raytrain.serve.adaptors.pod_cluster import with_pods
from raytrain.serve.adaptors.ray_cluster import RayCluster
from raytrain.serve.jobs.admission import (
    check_admission,
    check_cpu_precision,
    check_deletable,
    check_not_resumed,
    check_paths_on_head_node,
    keyed_earlier,
    new_job,
    resumed,
)
from raytrain.serve.jobs.durable import RETRY_AFTER_S, DurableRecords, service_id
from raytrain.serve.jobs.event_log import EventLog
from raytrain.serve.jobs.history import History, point_of
from raytrain.serve.jobs.provisioning import Provisioner
from raytrain.serve.jobs.reads import JobReads
from raytrain.serve.jobs.reports import RunReports
from raytrain.serve.jobs.scheduler import Scheduler
from raytrain.serve.jobs.store import STORE_FILE, JobStore
from raytrain.serve.jobs.versions import Versions
from raytrain.serve.tracking import check_trackers, tracker_factory
from raytrain.serve.tracking.pump import TrackingPump
from raytrain.spec import (
    JobSpec,
    JobStatus,
    PlanSummary,
    ResourcesSpec,
    ServiceConfig,
    check_imports_allowed,
)
from raytrain.spec.files import load_cpu_profile
from raytrain.spec.tracking import TrackingState

logger = logging.getLogger(__name__)

class JobManager(JobReads, RunReports):
    """Construct it (no I/O: a value of its config and cluster adaptor), then `start()` it:
    that opens the job store, reloads its records, reclaims what a lost manager left, and
    starts the scheduler thread (with `schedule`)."""

    def __init__(self, config: dict[str, Any], cluster: Cluster[Any] | None = None,
                 schedule: bool = True, planner: Callable[..., PlanSummary] = plan_summary,
                 persist: bool = True) -> None:
        self.config = ServiceConfig.model_validate(config)
        # False: records are kept in memory only (a trace replay, raytrain.sim.replay: no
        # head to lose, and its store writes were 40% of its time).
        self.persist = persist
        self.lifecycle_changes = 0  # events other than progress reports (Scheduler.idle_until)
        self.planner = planner  # once at submit; once more per capacity change
        self.cluster: Cluster[Any] = with_pods(cluster or RayCluster(), self.config, self)
        self.lock = threading.RLock()
        self._last_row: dict[str, int] = {}  # the latest step row a job's run reported
        self._changed = threading.Condition(self.lock)
        self._schedule = schedule
        self._stopping = threading.Event()
        self.records: dict[str, lc.Record] = {}
        self.tally = Tally.from_json(None)
        self._encoded: dict[str, str] = {}  # each job's status as JSON, until it changes
        self._versions = Versions()  # of each status, for the replicas' copies (changes())
        self._events: dict[str, EventLog] = {}
        self.handles: dict[str, Any] = {}  # each running job's runner (the adaptor's handle)
        self._inherited_digests: dict[str, str] = {}
        self._mirrored_digests: dict[str, str] = {}
        self.hardware = CATALOG  # until start() reads this machine's CPU profile
        # Set by start(): the store, its history, the provisioner and the scheduler.
        self._store: DurableRecords
        self._history: History
        self.provisioner: Provisioner
        self.scheduler: Scheduler
        self.tracking: TrackingPump | None = None  # started by start(), persisted services

    def start(self) -> JobManager:
        """Open the store and reload every job; requeue the ones in flight; start scheduling.
        Returns the manager, started."""
        # The devices jobs are planned on: this machine's, if `raytrain calibrate` ran.
        self.hardware = load_cpu_profile(self.config.state_path)
        if self.config.storage_endpoint:  # this process's stores, and (ray_cluster) the runs'
            os.environ["AWS_ENDPOINT_URL_S3"] = self.config.storage_endpoint
        db = JobStore(self.config.state_path / STORE_FILE)
        mirror = open_store(self.config.storage_uri) if is_remote(self.config.storage_uri) \
            else None
        self._store = DurableRecords(db, mirror, service_id(self.config.state_path),
                                     self.config.storage_lease_s)
        self._store.start(wait_for_lease=logger.warning)
        loaded, tally = self._store.load()
        self._inherited_digests = self._store.mirrored_digests()
        self.records = {job.id: lc.Record(job) for job, _ in loaded}
        self.tally = Tally.from_json(tally)
        self._events = {job.id: EventLog.reloaded(seq) for job, seq in loaded}
        self._history = History(db)  # each job's progress points, for charts
        self.provisioner = Provisioner(self.config, request=self.cluster.request_nodes,
                                       history=self.tally.spot,  # counted as jobs are billed
                                       ready=self.tally.ready,  # added to as nodes come up
                                       hardware=self.hardware, planner=self.planner)
        self.scheduler = Scheduler(self)
        self.scheduler.reclaim_after_restart()
        for job_id, record in list(self.records.items()):
            if not record.status.state.is_terminal:
                was = record.status.state.value
                self.apply(job_id, lc.ServiceRestarted())
                logger.info("job %s requeued after a service restart (was %s)", job_id, was)
        logger.info("job manager up with %d job records from %s%s", len(self.records),
                    db.path, f" and {mirror}" if mirror is not None else "")
        if self._schedule:
            threading.Thread(target=self._schedule_forever, name="scheduler",
                             daemon=True).start()
        if self.persist:  # a replay tracks nothing
            self.tracking = TrackingPump(self, tracker_factory(self.config),
                                         self.config.tracking_interval_s).start()
        return self

    # ------------------------------------------------------------ the lifecycle's effects

    def apply(self, job_id: str, event: lc.Event) -> Any:
        """Feed `event` to the job's lifecycle, keep the new record, carry out the effects;
        the lifecycle's reply."""
        with self.lock:
            before = self.records[job_id].status if not isinstance(event, lc.Submitted) else None
            now = self.cluster.now()
            out = lc.step(self.records[job_id], event, now)
            self.records[job_id] = out.record
            if not isinstance(event, lc.ProgressReported) or before is None or \
                    out.record.status.state != before.state:
                self.lifecycle_changes += 1  # more than progress: the next scheduling pass may act
            self._touch(job_id)
            self.tally.observe(before, out.record.status, now)
            for effect in out.effects:
                self._carry_out(job_id, effect, now)
            return out.reply

    def _touch(self, job_id: str) -> None:
        """The job's status changed (or it is gone): encode it afresh, tell the waiters."""
        self._encoded.pop(job_id, None)
        self._versions.touch(job_id)
        self._changed.notify_all()

    def _carry_out(self, job_id: str, effect: lc.Effect, now: float) -> None:
        if isinstance(effect, lc.Emit):  # stamped with the time the lifecycle stepped at
            self._events[job_id].append(job_id, effect.kind, effect.data, now)
            if effect.kind == "progress":
                self._history.add(job_id, point_of(effect.data, now))
        elif isinstance(effect, lc.Save):  # never raises for a failing disk (serve.jobs.durable)
            if not self.persist:
                return
            status = self.records[job_id].status
            self._store.put(status, self._events[job_id].next_seq, self.tally.to_json())
            self._history.save(job_id, release=status.state.is_terminal)
        elif isinstance(effect, lc.ReleaseNodes):
            self.provisioner.release(job_id)
        elif isinstance(effect, lc.StopRunner):
            handle = self.handles.pop(job_id, None)
            if handle is not None:
                self.cluster.stop(handle, effect.placement_group if effect.hard else None)
            if effect.hard and effect.placement_group is None or effect.reclaim:
                self.scheduler.reclaim_groups()  # it never said which group (or groups)
        elif isinstance(effect, lc.Replace):
            self.provisioner.replace(job_id, effect.leaving, now, effect.lost)
        elif isinstance(effect, lc.Rebuy):
            if self.provisioner.enabled:
                _, decided = self.provisioner.preempted(self.records[job_id].status, now)
                if decided is not None:
                    self.apply(job_id, decided)
        else:
            raise TypeError(f"unknown effect {effect!r}")

    # ---------------------------------------------------------------- requests from the API

    def submit(self, spec: JobSpec, caller: str | None = None,
               key: str | None = None) -> JobStatus:
        """Queue a job for `caller` (the token's name). A `key` seen from the same caller
        within IDEMPOTENCY_WINDOW_S returns that job instead of queueing another. `spec` was
        validated where it came in (the API, a resume); it is checked here only against what
        this service allows and holds."""
        self._check_writable()
        with self.lock:
            earlier = check_admission(self.records.values(), spec, caller, key,
                                      self.cluster.now(), self.config.max_active_jobs)
        if earlier is not None:
            return earlier
        # The layout, decided once: stored, never planned again.
        plan = self.planner(spec, hardware=self.hardware)
        check_imports_allowed(spec, self.config.allowed_import_packages)
        for loc, path in spec.import_paths():  # a typo is found now, not on a node bought
            resolve_factory(path, loc)  # for it
        check_paths_on_head_node(spec, self.config.storage_endpoint)
        check_cpu_precision(spec, _cpu_float8_unsupported)
        check_trackers(spec, self.config)
        self.provisioner.check_capacity(spec, self.cluster.node_resources)
        job = new_job(spec, plan, caller, key, self.cluster.now())
        with self.lock:
            earlier = check_admission(self.records.values(), spec, caller, key,
                                      self.cluster.now(), self.config.max_active_jobs)
            if earlier is not None:  # the same key came twice at once: the first one won
                return earlier
            self.records[job.id] = lc.Record(job)
            self._events[job.id] = EventLog()
            self.apply(job.id, lc.Submitted())
            job = self.records[job.id].status
        logger.info("job %s submitted by %s: %s", job.id, caller or "an open service",
                    spec.name)
        return job

    def capacity_refusal(self, resources: Any) -> dict[str, Any] | None:
        """For a job refused for other fields: whether its `resources` section alone could
        never start on this fixed cluster (a field error to give first: following the other
        errors' advice would not make it run). None if it could, or it is not known here."""
        try:
            section = ResourcesSpec.model_validate(resources or {})
        except ValidationError:
            return None  # its own errors are among the others
        if self.provisioner.enabled:
            return None  # what can be bought depends on the whole job: submit decides
        reason = never_fits(section.num_workers, {"CPU": section.cpus_per_worker,
                                                  "GPU": section.gpus_per_worker},
                            self.cluster.node_resources())
        return None if reason is None else FieldError(("resources", "num_workers"),
                                                      reason).to_json()

    def resume(self, job_id: str, caller: str | None = None, budget_usd: float | None = None,
               key: str | None = None) -> JobStatus:
        """Queue a new job that goes on from a failed or cancelled job's latest checkpoint;
        its tracked runs are new ones, tagged with the runs of the job it resumes."""
        with self.lock:
            record = self._record(job_id)
            self._check_writable()
            spec = resumed(record.status, budget_usd)
            earlier = keyed_earlier(self.records.values(), spec, caller, key,
                                    self.cluster.now())
            if earlier is not None:  # a retried request: the job it queued
                return earlier
            check_not_resumed(record.status, (r.status for r in self.records.values()))
            runs = record.status.tracking.runs if record.status.tracking is not None else {}
        job = self.submit(spec, caller, key)
        linked = {name: run.run_id for name, run in runs.items() if run.run_id}
        with self.lock:  # not a retried request's job, nor one whose runs are made
            if linked and self.records[job.id].status.tracking is None:
                self.apply(job.id, lc.TrackingNoted(TrackingState(resumes_run=linked)))
                job = self.records[job.id].status
        return job

    def exported_folder(self, job_id: str) -> Path | None:
        """The Hugging Face folder a kind 'hf' job wrote at its end (hf/ beside its
        checkpoints, on a local or mounted path), if it did."""
        root = self.config.checkpoints_uri(job_id)
        folder = Path(root) / "hf"
        return folder if not is_remote(root) and folder.is_dir() else None

    def export(self, job_id: str, step: int | None = None, merge: bool = False,
               dtype: str | None = None) -> dict[str, Any]:
        """A kind 'hf' job's checkpoint (the latest, or `step`'s) as a Hugging Face folder
        in the job's storage, exports/step_<N> (raytrain.train.export.export_to_storage; a
        LoRA job's adapter, or with `merge` its merged model, exports/step_<N>-merged)."""
        from raytrain.train.export import export_to_storage

        with self.lock:
            status = self._record(job_id).status
        step, ref = checkpoint_to_export(status, step)
        target = join(self.config.job_uri(job_id), "exports",
                      f"step_{step:09d}" + ("-merged" if merge else ""))
        return {"job_id": job_id, "step": step,
                "path": export_to_storage(status.spec, ref, target, merge, dtype)}

    def offers(self, spec: JobSpec | None, policy: str | None, keep: int,
               job_id: str | None = None) -> dict[str, Any]:
        """The catalog, and the policy's ranking for a spec or an existing job."""
        if job_id is not None:
            with self.lock:
                spec = self._record(job_id).status.spec
        return self.provisioner.offers(spec, policy, keep)

    def cancel(self, job_id: str, caller: str | None = None) -> JobStatus:
        with self.lock:
            record = self._record(job_id)
            self._check_writable()
            if record.status.state.is_terminal:
                raise JobStateError(f"job {job_id} already ended {record.status.state.value};"
                                    " nothing to cancel")
            self.apply(job_id, lc.CancelRequested())
            logger.info("job %s cancelled by %s (was running: %s)", job_id,
                        caller or "an open service", record.run is not None)
            return self.records[job_id].status

    def token_digests(self) -> dict[str, str] | None:
        """{token name: sha256 of the token} for the API's check; None when the service runs
        open. The first call on a new state directory writes the operator token."""
        if not self.config.auth:
            return None
        local = token_digests(self.config.state_path)
        if self._store.mirror is None:
            return local
        # A new head node keeps accepting the tokens clients hold: their digests come back
        # from the bucket (a name taken here by a new token keeps the old one as NAME@earlier).
        merged = {(name if local.get(name, digest) == digest else f"{name}@earlier"): digest
                  for name, digest in self._inherited_digests.items()}
        merged.update(local)
        if merged != self._mirrored_digests:
            self._store.mirror_digests(merged)
            self._mirrored_digests = merged
        return merged

    def _check_writable(self) -> None:
        """ServiceUnavailableError (503) while the job store takes no writes
        (serve.jobs.durable)."""
        if not self._store.flush():
            raise ServiceUnavailableError(
                f"{self._store.degraded}. Nothing was changed. To fix: retry in "
                f"{RETRY_AFTER_S} s; the operator frees the service's state directory "
                "(disk space, permissions)", RETRY_AFTER_S)

    def delete(self, job_id: str) -> JobStatus:
        """Forget an ended job: its record, events, checkpoints and logs."""
        with self.lock:
            record = self._record(job_id)
            job = record.status
            check_deletable(record, [r.status for r in self.records.values()])
            self._check_writable()
            self._store.delete(job_id)
            del self.records[job_id]
            self._touch(job_id)
            self._events.pop(job_id, None)
            self._history.forget(job_id)
        root = self.config.job_uri(job_id)  # large: removed outside the lock
        try:
            open_store(root).delete_prefix("")
        except StoreError as exc:  # the record is gone; what is left can go by hand
            logger.error("job %s deleted, but not its files: %s", job_id, exc)
        logger.info("job %s deleted with its checkpoints and logs (%s)", job_id, root)
        return job

    def shutdown(self) -> None:
        """Stop scheduling and every running job (used when the service that started us stops)."""
        self._stopping.set()
        if self.tracking is not None:
            self.tracking.stop()
        with self.lock:
            for job_id in list(self.handles):
                self.apply(job_id, lc.ServiceStopping())
            self._store.close()
            self._store.db.close()

    # -------------------------------------------------------------------- scheduling

    def _schedule_forever(self) -> None:
        if self.provisioner.enabled:
            try:
                self.cluster.prepare_requests()
            except Exception:  # the first request will try again
                logger.exception("could not start Ray's autoscaling coordinator")
        while not self._stopping.is_set():
            try:
                with self.lock:  # records kept while the disk was failing (serve.jobs.durable)
                    if self._store.flush():
                        self._history.retry()
                self.scheduler.pass_once()
            except Exception:  # keep scheduling whatever one job did
                logger.exception("scheduler pass failed")
            self._stopping.wait(self.config.scheduler_interval_s)


def _cpu_float8_unsupported() -> str | None:
    """Why this node's CPU cannot run float8 matmuls, or None (a child process's probe, once
    per service; asked only for fp8 jobs on CPU workers)."""
    from raytrain.parallel.float8 import cpu_float8_unsupported  # torch: for these jobs only

    return cpu_float8_unsupported()
