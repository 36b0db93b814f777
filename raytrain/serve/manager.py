"""The job manager: one detached Ray actor on the head node that owns every job.

It validates and queues submissions, starts a job when its whole worker group fits the free
capacity (raytrain.core.capacity), runs each job in a `JobRunner` actor that calls Ray Train's
`fit()`, takes progress from rank 0, keeps an event stream per job, and writes every record to
the durable store. Cancelling a job kills its runner; Ray's ownership then takes down the
Train controller and workers, and Ray Train's placement-group cleaner frees their resources.

The actor outlives the Serve app (it is detached), so redeploying the HTTP layer loses
nothing. If the actor itself is lost, a new one reloads every record from the store and puts
jobs that were in flight back in the queue; they resume from their latest checkpoint.

Methods answer plain values and report expected failures as an envelope
`{"ok": value}` / `{"error": kind, "detail": ...}` so nothing depends on exceptions
crossing the actor boundary.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray._raylet import PlacementGroupID
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, remove_placement_group

from raytrain.catalog import unknown_policy
from raytrain.cloud.interruption import watch_endpoint
from raytrain.core.capacity import Queued, admit, backfill, never_fits, worker_group_demand
from raytrain.core.lifecycle import enter
from raytrain.errors import FieldError, RaytrainError, SpecError
from raytrain.offers import offers_response
from raytrain.serve.provisioning import Provisioner
from raytrain.serve.store import JobStore
from raytrain.spec import (
    CheckpointInfo,
    JobEvent,
    JobResult,
    JobSpec,
    JobState,
    JobStatus,
    PlanSummary,
    PreemptionRecord,
    Progress,
    Resources,
    ServiceConfig,
    check_imports_allowed,
    parse_job_spec,
)
from raytrain.train.worker_logs import read_logs

logger = logging.getLogger(__name__)

NAMESPACE = "raytrain"
MANAGER_NAME = "raytrain-job-manager"
RUNNER_PREFIX = "raytrain-job-"  # + the job's id: one runner actor per running job
PROGRESS_PERSIST_INTERVAL_S = 5.0
# How long a cancelled worker group has to leave on its own before it is killed: once it
# runs, rank 0 reads the stop at its next report; while it still starts, it stops as soon as
# it is up (worker_group_started answers -1), which can take Ray Train's whole start timeout.
CANCEL_GRACE_S = 20.0
CANCEL_STARTING_GRACE_S = 120.0
# Resources a training worker group's placement group may hold; one holding anything else is
# not a training run's (see _reclaim_orphaned_groups).
WORKER_RESOURCE_KEYS = frozenset({"CPU", "GPU", "memory"})
EVENTS_KEPT_PER_JOB = 5000
# Records are saved on every state change and checkpoint and at least every
# PROGRESS_PERSIST_INTERVAL_S of progress (one report a second at most): far fewer events than
# this can follow a record's last save.
RELOAD_EVENT_SEQ_GAP = 10_000
HEAD_NODE_RESOURCE = "node:__internal_head__"
# After an interruption notice the instance goes within two minutes; wait that long at most
# for the noticed nodes to leave before resuming on the same node type.
NOTICE_GRACE_S = 150.0


@ray.remote(num_cpus=0)
class JobRunner:
    """Runs one job's `fit()`; killing this actor stops the job."""

    def run(
        self, spec_json: dict[str, Any], job_id: str, checkpoint_root: str, run_root: str,
        worker_resources: dict[str, float] | None = None,
        interruption_endpoint: str | None = None,
    ) -> None:
        from raytrain.train.launcher import run_training_job

        run_training_job(
            JobSpec.model_validate(spec_json),
            job_id,
            Path(checkpoint_root),
            Path(run_root),
            (NAMESPACE, MANAGER_NAME),
            worker_resources or {},
            interruption_endpoint,
        )


@dataclass
class _Run:
    runner: ActorHandle
    done: ray.ObjectRef
    demand: dict[str, float]
    attempt: int = 0
    progress_step: int = -1
    result: dict[str, Any] | None = None
    placement_group: str | None = None  # reported by rank 0; lets a hard stop free it
    stop_deadline: float | None = None  # set when the job was asked to stop
    billed_since: float | None = None  # unix time the job's bought nodes started to count
    cost_before: float = 0.0  # dollars spent before this run
    launched_at: float = 0.0  # unix time: capacity in hand, worker group asked for
    nodes_at_launch: frozenset[str] = frozenset()  # bought nodes alive at launch (Ray ids)
    describe: str = ""  # nodes and layout, for the preemption log
    moving_to: str | None = None  # the policy moves the job: checkpoint, stop, resume there
    reviewed_at: float = 0.0  # unix time of the policy's last look at the running job


@dataclass
class _EventLog:
    first_seq: int = 0
    events: list[JobEvent] = field(default_factory=list)

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.events)


def predictions(spec: JobSpec) -> dict[str, Any]:
    predicted = spec.predicted()
    if predicted is None:
        return {}
    return {
        "predicted_step_s": predicted.step_s,
        "predicted_tokens_per_s": predicted.tokens_per_s,
        "predicted_memory_gib": predicted.memory_bytes / 2**30,
        "reason": predicted.reason,
    }


def plan_summary(spec: JobSpec) -> PlanSummary:
    layout = spec.layout
    return PlanSummary(
        strategy=spec.parallel.strategy,
        layout={
            "dp_replicate": layout.dp_replicate,
            "dp_shard": layout.dp_shard,
            "tp": layout.tp,
            "pp": layout.pp,
            "virtual_stages": layout.virtual_stages,
            "microbatches": layout.microbatches,
        },
        description=layout.describe(),
        **predictions(spec),
        grad_accum_steps=spec.grad_accum_steps,
        tokens_per_step=spec.tokens_per_step,
        backend="nccl" if spec.resources.use_gpu else "gloo",
    )


class JobManager:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = ServiceConfig.model_validate(config)
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._store = JobStore(self.config.state_path / "jobs.db")
        records = self._store.load_all()
        self._jobs: dict[str, JobStatus] = {job.id: job for job, _ in records}
        # Events emitted after a record's last save were not counted in it: skip past any
        # number they could have taken, so numbering only grows across a restart.
        self._events: dict[str, _EventLog] = {
            job.id: _EventLog(first_seq=seq + RELOAD_EVENT_SEQ_GAP if seq else 0)
            for job, seq in records}
        self._runs: dict[str, _Run] = {}
        self._persisted_at: dict[str, float] = {}
        self._provisioner = Provisioner(self.config)
        # Jobs resuming after a notice: (until, nodes) - wait for those nodes to go first.
        self._leaving: dict[str, tuple[float, set[str]]] = {}
        self._failures: dict[str, tuple[str, int]] = {}  # each job's last error and its step
        self._passed: dict[str, int] = {}  # queued jobs: how often later ones started first
        self._reclaim_after_restart()
        for job in list(self._jobs.values()):
            if not job.state.is_terminal:
                self._requeue_after_restart(job)
        logger.info("job manager up with %d job records from %s", len(self._jobs), self._store.path)
        self._stopping = threading.Event()
        threading.Thread(target=self._schedule_forever, name="scheduler", daemon=True).start()

    # ---------------------------------------------------------------- requests from the API

    def submit(self, document: dict[str, Any]) -> dict[str, Any]:
        try:
            spec = parse_job_spec(document)
            check_imports_allowed(spec, self.config.allowed_import_packages)
            policy_error = self._provisioner.policy_error(spec)
            if policy_error is not None:
                raise SpecError([policy_error])
            _check_paths_on_head_node(spec)
            if not self._provisioner.enabled:
                self._check_fits_the_cluster(spec)
            elif (holding := self._provisioner.holding_error(spec)) is not None:
                raise SpecError([holding])
        except SpecError as exc:
            return {"error": "spec", "detail": [e.to_json() for e in exc.errors]}
        now = time.time()
        job = JobStatus(
            id=uuid.uuid4().hex[:12],
            state=JobState.PENDING,
            spec=spec,
            plan=plan_summary(spec),
            progress=Progress(total_steps=spec.training.steps),
            message="queued",
            created_at=now,
        )
        with self._lock:
            self._jobs[job.id] = job
            self._events[job.id] = _EventLog()
            self._transition(job, JobState.PENDING, "queued")
        logger.info("job %s submitted: %s", job.id, spec.name)
        return {"ok": job.model_dump(mode="json")}

    def offers(self, spec_json: dict[str, Any] | None, policy: str | None, keep: int,
               job_id: str | None = None) -> dict[str, Any]:
        """The catalog, and the policy's ranking for a spec or an existing job."""
        with self._lock:
            if job_id is not None:
                job = self._jobs.get(job_id)
                if job is None:
                    return {"error": "not_found", "detail": f"no job with id {job_id!r}"}
                spec_json = job.spec.model_dump(mode="json")
        spec = JobSpec.model_validate(spec_json) if spec_json is not None else None
        provisioner = self._provisioner
        name = policy or (spec.capacity.policy if spec else None) or self.config.default_policy
        error = unknown_policy(name, provisioner.policies, ("policy",))
        if error is not None:
            return {"error": "spec", "detail": [error.to_json()]}
        response = offers_response(provisioner.catalog, provisioner.policies[name], spec, keep)
        return {"ok": response.model_dump(mode="json")}

    def list_jobs(self, limit: int | None = None, after: str | None = None,
                  states: list[str] | None = None) -> dict[str, Any]:
        """Jobs oldest first: at most `limit` of them after the cursor `after` (the previous
        page's `next`), only in `states` if given; `next` is None on the last page."""
        with self._lock:
            jobs = [job for job in self._jobs.values()
                    if not states or job.state.value in states]
            if after:
                jobs = [job for job in jobs if _cursor(job) > after]
            page = jobs if limit is None else jobs[:limit]
            more = limit is not None and len(jobs) > limit
            return {"jobs": [job.model_dump(mode="json") for job in page],
                    "next": _cursor(page[-1]) if more else None}

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return job.model_dump(mode="json") if job else None

    def cancel(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return {"error": "not_found", "detail": f"no job with id {job_id!r}"}
            if job.state.is_terminal:
                return {
                    "error": "state",
                    "detail": f"job {job_id} already ended {job.state.value}; nothing to cancel",
                }
            run = self._runs.get(job_id)
            if run is not None:
                # Rank 0 reads this in the reply to its next progress report and every rank
                # leaves at the same step; the run keeps its resources counted until the
                # group is gone (or killed after CANCEL_GRACE_S, see _reap_finished).
                run.stop_deadline = time.monotonic() + (
                    CANCEL_GRACE_S if run.placement_group else CANCEL_STARTING_GRACE_S)
            job.finished_at = time.time()
            self._transition(job, JobState.CANCELLED, "cancelled by request")
            self._end(job)
            logger.info("job %s cancelled (was running: %s)", job_id, run is not None)
            return {"ok": job.model_dump(mode="json")}

    def ready(self) -> dict[str, Any]:
        """Readiness: this actor answers, its scheduler runs, and its store takes writes."""
        writable = self._store.writable()
        return {"ready": writable, "status": "ready" if writable else "store not writable",
                "jobs": len(self._jobs), "store": str(self._store.path)}

    def logs(self, job_id: str, offsets: dict[int, int] | None, rank: int | None,
             max_bytes: int) -> dict[str, Any]:
        """Each worker's output, by rank, from the given offsets (default: the tail)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return {"error": "not_found", "detail": f"no job with id {job_id!r}"}
            state = job.state.value
        chunks = read_logs(self.config.checkpoint_root / job_id / "logs", offsets, rank,
                           max_bytes)
        return {"ok": {"job_id": job_id, "state": state,
                       "ranks": [asdict(chunk) for chunk in chunks]}}

    def delete(self, job_id: str) -> dict[str, Any]:
        """Forget an ended job: its record, events, checkpoints and logs."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return {"error": "not_found", "detail": f"no job with id {job_id!r}"}
            if not job.state.is_terminal or job_id in self._runs:
                return {"error": "state", "detail": (
                    f"job {job_id} is {job.state.value}; only an ended job can be deleted. "
                    f"To fix: cancel it first (raytrain cancel {job_id}), then delete it")}
            self._store.delete(job_id)
            del self._jobs[job_id]
            self._events.pop(job_id, None)
            self._persisted_at.pop(job_id, None)
            self._changed.notify_all()
        root = self.config.checkpoint_root / job_id  # large: removed outside the lock
        shutil.rmtree(root, ignore_errors=True)
        logger.info("job %s deleted with its checkpoints and logs (%s)", job_id, root)
        return {"ok": job.model_dump(mode="json")}

    def wait_events(self, job_id: str, after_seq: int,
                    timeout_s: float) -> list[dict[str, Any]] | None:
        """Events with seq > after_seq, waiting up to timeout_s for one; None for no such job."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                log = self._events.get(job_id)
                if log is None:
                    return None
                if not log.events:  # a record reloaded after a restart has no history
                    return self._synthetic_events(job_id)
                fresh = log.events[max(0, after_seq + 1 - log.first_seq) :]
                if fresh:
                    return [event.model_dump(mode="json") for event in fresh]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._changed.wait(remaining)

    def shutdown(self) -> None:
        """Stop scheduling and every running job (used when the service that started us stops)."""
        self._stopping.set()
        with self._lock:
            for job_id in list(self._runs):
                _hard_stop(self._runs.pop(job_id))
                job = self._jobs[job_id]
                if job.state.is_terminal:
                    continue
                job.message = "the service stopped; the job resumes from its checkpoint on restart"
                self._save(job)
        self._store.close()

    # ------------------------------------------------------------ reports from rank 0

    def worker_group_started(self, job_id: str, resumed_step: int,
                             placement: dict[str, Any]) -> int:
        with self._lock:
            job, run = self._jobs.get(job_id), self._runs.get(job_id)
            if job is None or run is None:
                return -1
            run.attempt += 1
            run.progress_step = -1
            run.placement_group = placement.get("placement_group")
            if job.state.is_terminal:  # cancelled while the group was starting: stop now
                run.stop_deadline = time.monotonic() + CANCEL_GRACE_S
                return -1
            if job.resources.node_type is None:  # a fixed cluster: what the workers found
                job.resources = Resources(
                    accelerator=placement["accelerator"],
                    market="local",
                    nodes=placement["nodes"],
                    gpus=run.demand.get("GPU", 0.0),
                    cpus=run.demand.get("CPU", 0.0),
                    hourly_usd=0.0,
                )
            if job.started_at is None:
                job.started_at = time.time()
            if run.attempt == 1 and job.restarts == 0:
                self._transition(job, JobState.RUNNING, "training")
            else:
                if run.attempt > 1:
                    job.restarts += 1
                self._transition(
                    job,
                    JobState.RECOVERING,
                    f"worker group restarted; resuming from step {resumed_step}",
                    resumed_step=resumed_step,
                )
            return run.attempt

    def report_progress(self, job_id: str, attempt: int,
                        payload: dict[str, Any]) -> dict[str, bool]:
        """Record rank 0's report; the reply tells the workers whether to stop."""
        with self._lock:
            job, run = self._jobs.get(job_id), self._runs.get(job_id)
            if job is None or run is None or attempt != run.attempt:
                return {"stop": True}  # a report from a run we no longer track
            if run.stop_deadline is not None or job.state.is_terminal:
                return {"stop": True}
            reply = {"stop": False, "move": run.moving_to is not None}
            if payload["step"] < run.progress_step:  # overtaken by a later report
                return reply
            first_report = run.progress_step < 0
            run.progress_step = payload["step"]
            self._bill(job, run)
            if first_report and job.preemption_log and job.preemption_log[-1].after is None:
                self._resumed_after_preemption(job, run)
            if job.state == JobState.RECOVERING:
                self._transition(job, JobState.RUNNING, "training")
            job.progress = Progress.model_validate(
                {k: v for k, v in payload.items() if k != "sent_at"}
            )
            if job.plan is not None and job.progress.tokens_per_s:
                job.plan.measured_step_s = job.spec.tokens_per_step / job.progress.tokens_per_s
            # sent_at stays in the event: followers can see how fresh each report is.
            self._emit(job_id, "progress", payload)
            now = time.monotonic()
            if now - self._persisted_at.get(job_id, 0.0) >= PROGRESS_PERSIST_INTERVAL_S:
                self._save(job)
            return reply

    def report_checkpoint(self, job_id: str, attempt: int, step: int, path: str) -> None:
        with self._lock:
            job, run = self._jobs.get(job_id), self._runs.get(job_id)
            if job is None or run is None or attempt != run.attempt:
                return
            job.checkpoint = CheckpointInfo(step=step, path=path)
            if not job.state.is_terminal:  # a cancelled job's stream has already ended
                self._emit(job_id, "checkpoint", {"step": step, "path": path})
            self._save(job)

    def report_finished(self, job_id: str, attempt: int, result: dict[str, Any]) -> None:
        with self._lock:
            run = self._runs.get(job_id)
            if run is not None and attempt == run.attempt:
                run.result = result

    # -------------------------------------------------------------------- scheduling

    def _schedule_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                self._reap_finished()
                self._start_queued()
                self._review_running()
                self._provisioner.refresh(time.time())
            except Exception:  # keep scheduling whatever one job did
                logger.exception("scheduler pass failed")
            self._stopping.wait(self.config.scheduler_interval_s)

    def _reap_finished(self) -> None:
        with self._lock:
            refs = [run.done for run in self._runs.values()]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        now = time.monotonic()
        with self._lock:
            for job_id, run in list(self._runs.items()):
                job = self._jobs[job_id]
                if run.done in ready:
                    del self._runs[job_id]
                    ray.kill(run.runner, no_restart=True)
                    if not job.state.is_terminal:  # a cancelled job already has its end
                        self._finish(job, run)
                elif run.stop_deadline is not None and now > run.stop_deadline:
                    logger.warning(
                        "job %s did not stop within %.0f s of being cancelled; killing it",
                        job_id, CANCEL_GRACE_S,
                    )
                    del self._runs[job_id]
                    _hard_stop(run)
                    if run.placement_group is None:  # it never said which group it holds
                        self._reclaim_orphaned_groups()

    def _finish(self, job: JobStatus, run: _Run) -> None:
        self._bill(job, run)
        try:
            ray.get(run.done)
            error = None if run.result else "training ended without a final report"
        except Exception as exc:  # the worker's error, wrapped by Ray
            error = _describe_failure(exc)
        if self._recovered(job, run, error):
            return
        job.finished_at = time.time()
        if error is None:
            assert run.result is not None
            job.result = JobResult.model_validate(
                {k: run.result[k] for k in JobResult.model_fields}
            )
            self._transition(job, JobState.SUCCEEDED, "finished")
        else:
            job.error = error
            logger.warning("job %s failed: %s", job.id, error)
            self._transition(job, JobState.FAILED, (
                f"failed; each worker's output is in `raytrain logs {job.id}` "
                f"(GET /v1/jobs/{job.id}/logs)"))
        self._end(job)

    def _start_queued(self) -> None:
        with self._lock:
            if not any(self._waiting(job) for job in self._jobs.values()):
                return  # nothing waits: spare the GCS a resource query every tick
        total = {k: float(v) for k, v in ray.cluster_resources().items()}
        with self._lock:
            held = [run.demand for run in self._runs.values()]
            queue = [job for job in self._jobs.values() if self._waiting(job)]
            if self._provisioner.enabled:  # each job gets nodes of its own: no queue
                for job in queue:
                    self._start_on_bought_nodes(job, total, held)
                return
            demands = {job.id: worker_group_demand(job.spec.resources.num_workers,
                                                   job.spec.resources.cpus_per_worker,
                                                   job.spec.resources.gpus_per_worker)
                       for job in queue}
            decided = backfill([Queued(job.id, demands[job.id], self._passed.get(job.id, 0))
                                for job in queue], total, held,
                               self.config.max_backfill_passes)
            for job_id in decided.passed:
                self._passed[job_id] = self._passed.get(job_id, 0) + 1
            for job in queue:
                if job.id in decided.waiting:
                    self._say_queued(job, decided.waiting[job.id])
                    continue
                self._passed.pop(job.id, None)
                self._launch(job, job.spec, demands[job.id], notice_endpoint=watch_endpoint(
                    self.config.interruption_endpoint, "local", None))

    def _check_fits_the_cluster(self, spec: JobSpec) -> None:
        """On a fixed cluster, refuse a worker group that could never start (it would wait
        in the queue forever, and everything behind it with it)."""
        resources = spec.resources
        per_worker = {"CPU": resources.cpus_per_worker, "GPU": resources.gpus_per_worker}
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        reason = never_fits(resources.num_workers, per_worker, nodes)
        if reason is not None:
            raise SpecError([FieldError(("resources", "num_workers"), reason)])

    def _reclaim_after_restart(self) -> None:
        """What a lost manager's runs left behind: their runner actors (by name) and their
        worker groups' placement groups, which nothing else frees (Ray Train's cleaner needs
        the dashboard's state API). Jobs that were in flight are queued again and resume from
        their checkpoints."""
        for entry in ray.util.list_named_actors(all_namespaces=True):
            if entry["namespace"] == NAMESPACE and entry["name"].startswith(RUNNER_PREFIX) \
                    and entry["name"] != MANAGER_NAME:
                try:
                    ray.kill(ray.get_actor(entry["name"], namespace=NAMESPACE),
                             no_restart=True)
                    logger.warning("reclaimed %s, left by a run this manager does not own",
                                   entry["name"])
                except ValueError:  # gone meanwhile
                    pass
        self._reclaim_orphaned_groups()

    def _reclaim_orphaned_groups(self) -> None:
        """Remove training placement groups that no run of ours holds, when none of our runs
        is still starting (a starting run's group is not known yet)."""
        owned = {run.placement_group for run in self._runs.values()}
        if None in owned:
            return
        node_types = set(self.config.node_types)
        for group_id, group in ray.util.placement_group_table().items():
            if group["state"] == "REMOVED" or group_id in owned:
                continue
            keys = {key for bundle in group["bundles"].values() for key in bundle}
            if keys and keys <= WORKER_RESOURCE_KEYS | node_types:
                remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(group_id)))
                logger.warning("reclaimed placement group %s (%s), held by no run of this "
                               "service", group_id, group["bundles"])

    def _say_queued(self, job: JobStatus, message: str) -> None:
        if job.message != message:
            logger.info("job %s %s", job.id, message)
            self._transition(job, JobState.PENDING, message)

    def _review_running(self) -> None:
        """Let the policy look at running jobs on bought capacity again: when the offers
        change (a cheaper one may pay for the move) and every review_interval_s (the
        deadline). A move happens at a checkpoint taken for it."""
        if not self._provisioner.enabled:
            return
        now = time.time()
        with self._lock:
            prices_changed = self._provisioner.reload_if_changed()
            for job_id, run in self._runs.items():
                job = self._jobs[job_id]
                if job.state != JobState.RUNNING or run.moving_to is not None:
                    continue
                due = now - run.reviewed_at >= self.config.review_interval_s
                if not (prices_changed or due):
                    continue
                run.reviewed_at = now
                placement = self._provisioner.review(job, now, "prices" if prices_changed
                                                     else "progress")
                if placement is not None:
                    run.moving_to = f"{placement.nodes} x {placement.node_type}"
                    job.message = (f"moving to {run.moving_to} at a checkpoint: "
                                   f"{job.decisions[-1].reason}")
                    self._save(job)

    def _waiting(self, job: JobStatus) -> bool:
        """Queued, or (autoscaled) provisioning with its nodes not yet up."""
        return job.state == JobState.PENDING or (
            job.state in (JobState.PROVISIONING, JobState.RECOVERING)
            and job.id not in self._runs)

    def _start_on_bought_nodes(self, job: JobStatus, total: dict[str, float],
                               held: list[dict[str, float]]) -> None:
        """An autoscaled job: decide and request its nodes, start it once they are up, and
        decide again if they do not come in time. Jobs do not queue behind each other: each
        gets nodes of its own."""
        now = time.time()
        leaving = self._leaving.get(job.id)
        if leaving is not None:  # after a notice: let the noticed node go before resuming
            until, nodes = leaving
            if now < until and nodes <= _alive_nodes():  # none of the job's nodes gone yet
                return
            del self._leaving[job.id]
        before = (job.message, len(job.decisions))
        placement = self._provisioner.place(job, now)
        if placement is not None and now - placement.requested_at > \
                self._provisioner.policy_for(job.spec).capacity_wait_s:
            placement = self._provisioner.capacity_missing(job, now)
        if placement is None:
            if (job.message, len(job.decisions)) != before:
                state = JobState.RECOVERING if job.state == JobState.RECOVERING \
                    else JobState.PENDING
                self._transition(job, state, job.message or "waiting for capacity")
            return
        resources = placement.spec.resources
        demand = {**worker_group_demand(placement.workers, resources.cpus_per_worker,
                                        resources.gpus_per_worker), **placement.demand}
        if not admit(demand, total, held).fits:
            if (job.message, len(job.decisions)) != before:
                state = JobState.RECOVERING if job.state == JobState.RECOVERING \
                    else JobState.PROVISIONING
                self._transition(job, state, job.message or "requesting nodes")
            return
        offer = placement.option.offer
        self._launch(job, placement.spec, demand, placement.worker_resources,
                     f"{placement.nodes} x {placement.node_type}, "
                     f"{placement.spec.layout.describe()}",
                     watch_endpoint(self.config.interruption_endpoint, placement.option.market,
                                    offer.provider))
        # The nodes are up; Ray Train asks for them itself as its controller starts. Two
        # requests at once would count them twice and buy a spare node.
        self._provisioner.handed_over(job.id)
        held.append(demand)

    def _launch(self, job: JobStatus, spec: JobSpec, demand: dict[str, float],
                worker_resources: dict[str, float] | None = None, describe: str = "",
                notice_endpoint: str | None = None) -> None:
        root = self.config.checkpoint_root / job.id
        # On the head node: Ray Train puts its controller (and Ray Data its detached
        # autoscaling coordinator) beside the caller, and a bought node that keeps any actor
        # is never idle, so the autoscaler would never let it go.
        runner = JobRunner.options(name=f"{RUNNER_PREFIX}{job.id}", namespace=NAMESPACE,
                                   resources={HEAD_NODE_RESOURCE: 0.001}).remote()
        done = runner.run.remote(
            spec.model_dump(mode="json"), job.id, str(root / "checkpoints"), str(root / "ray"),
            worker_resources, notice_endpoint,
        )
        now = time.time()
        bought = set(worker_resources or ())
        self._runs[job.id] = _Run(
            runner=runner, done=done, demand=demand,
            billed_since=now if worker_resources else None, cost_before=job.cost_usd,
            launched_at=now, describe=describe or spec.layout.describe(),
            nodes_at_launch=frozenset(_alive_nodes(bought)) if bought else frozenset(),
        )
        if job.state != JobState.RECOVERING:
            self._transition(job, JobState.PROVISIONING, "starting the worker group")
        logger.info("job %s launched with %s", job.id, demand)

    def _recovered(self, job: JobStatus, run: _Run, error: str | None) -> bool:
        """On bought capacity, the job manager (not Ray Train) restarts a stopped worker
        group: after a notice (the workers checkpointed and stopped), after a node loss
        without one (a preemption too: it never uses the failure budget), or after a real
        error while max_restarts allows. True if the job goes on."""
        now = time.time()
        if error is None and run.result and run.result.get("preempted") and run.moving_to:
            self._transition(job, JobState.RECOVERING, f"moving to {run.moving_to} from step "
                             f"{run.result.get('steps')}, as the policy decided")
            return True
        if error is None and run.result and run.result.get("preempted"):
            notice = True
        elif error is not None and run.nodes_at_launch - _alive_nodes():
            notice = False
        elif error is not None and self._worth_retrying(job, run, error):
            job.restarts += 1
            self._transition(job, JobState.RECOVERING, f"restarting after an error "
                             f"({job.restarts} of {job.spec.training.max_restarts}): {error}")
            return True
        else:
            return False
        saved = job.checkpoint.step if job.checkpoint else None
        result = run.result or {}
        # After a notice the workers say where they stopped; after a loss, the last report
        # (sent about once a second) is all there is: a lower bound.
        reached = result.get("steps") or max(job.progress.step, run.progress_step, saved or 0)
        noticed, durable = result.get("noticed_at"), result.get("checkpointed_at")
        record = PreemptionRecord(
            time=now, notice=notice, reached_step=reached, checkpoint_step=saved,
            lost_steps=max(0, reached - (saved or 0)),
            notice_to_checkpoint_s=durable - noticed if noticed and durable else None,
            before=run.describe,
        )
        job.preemptions += 1
        job.preemption_log.append(record)
        job.lost_steps += record.lost_steps
        if self._provisioner.enabled:  # on a fixed cluster the job resumes where it was
            self._provisioner.preempted(job, now, run.nodes_at_launch)
        if notice:  # the noticed nodes go within two minutes: do not start on them again
            self._leaving[job.id] = (now + NOTICE_GRACE_S, set(run.nodes_at_launch))
        self._emit(job.id, "preemption", record.model_dump(mode="json"))
        self._transition(job, JobState.RECOVERING, (
            f"preempted {'after a notice' if notice else 'without notice'} at step {reached}; "
            f"resuming from step {saved or 0} on the policy's next-best capacity"))
        return True

    def _worth_retrying(self, job: JobStatus, run: _Run, error: str) -> bool:
        """Retry a failed run only if another try could go differently: not when it failed
        before its first training step (building the model, data or layout fails the same way
        every time), not when the same error ends a run at the same step twice, and not past
        training.max_restarts. Each retry counts in the job's restarts."""
        failed_at = max(run.progress_step, job.progress.step)
        previous = self._failures.get(job.id)
        self._failures[job.id] = (error, failed_at)
        if run.progress_step < 0:
            logger.info("job %s failed before its first step: not retried", job.id)
            return False
        if previous == (error, failed_at):
            logger.info("job %s failed twice at step %d with the same error: not retried",
                        job.id, failed_at)
            return False
        return job.restarts < job.spec.training.max_restarts

    def _resumed_after_preemption(self, job: JobStatus, run: _Run) -> None:
        now = time.time()
        last = job.preemption_log[-1]
        last.after = run.describe
        last.capacity_to_first_step_s = now - run.launched_at
        last.down_s = now - last.time
        step_s = job.plan.measured_step_s if job.plan and job.plan.measured_step_s else 0.0
        last.extra_cost_usd = job.resources.hourly_usd * (
            last.down_s + last.lost_steps * step_s) / 3600
        job.down_s += last.down_s
        job.preemption_cost_usd += last.extra_cost_usd
        self._save(job)

    def _requeue_after_restart(self, job: JobStatus) -> None:
        was = job.state
        if was in (JobState.RUNNING, JobState.RECOVERING, JobState.PROVISIONING):
            job.restarts += 1 if job.started_at is not None else 0
        enter(job, JobState.PENDING, f"the service restarted while the job was {was.value}; "
              "it resumes from its latest checkpoint")
        self._save(job)
        logger.info("job %s requeued after a service restart (was %s)", job.id, was.value)

    # ------------------------------------------------------------------- bookkeeping

    def _transition(self, job: JobStatus, state: JobState, message: str, **extra: Any) -> None:
        enter(job, state, message)
        self._emit(job.id, "state", {"state": state.value, "message": message, **extra})
        self._save(job)

    def _end(self, job: JobStatus) -> None:
        """Close the job's event stream and withdraw its request for nodes; callers have saved
        the final record in _transition."""
        self._provisioner.release(job.id)
        self._failures.pop(job.id, None)
        self._passed.pop(job.id, None)
        run = self._runs.get(job.id)
        if run is not None:
            self._bill(job, run)
        self._emit(job.id, "end", {"state": job.state.value, "error": job.error})

    def _bill(self, job: JobStatus, run: _Run) -> None:
        """Dollars spent: what earlier runs cost plus this run's nodes for as long as held."""
        if run.billed_since is not None:
            held_h = (time.time() - run.billed_since) / 3600
            job.cost_usd = run.cost_before + held_h * job.resources.hourly_usd

    def _emit(self, job_id: str, kind: str, data: dict[str, Any]) -> None:
        log = self._events[job_id]
        log.events.append(
            JobEvent(seq=log.next_seq, type=kind, job_id=job_id, time=time.time(), data=data)  # type: ignore[arg-type]
        )
        if len(log.events) > EVENTS_KEPT_PER_JOB:
            drop = len(log.events) - EVENTS_KEPT_PER_JOB
            del log.events[:drop]
            log.first_seq += drop
        self._changed.notify_all()

    def _synthetic_events(self, job_id: str) -> list[dict[str, Any]]:
        job = self._jobs[job_id]
        self._emit(job_id, "state", {"state": job.state.value, "message": job.message})
        if job.state.is_terminal:
            self._emit(job_id, "end", {"state": job.state.value, "error": job.error})
        return [event.model_dump(mode="json") for event in self._events[job_id].events]

    def _save(self, job: JobStatus) -> None:
        log = self._events.get(job.id)
        self._store.put(job, log.next_seq if log else 0)
        self._persisted_at[job.id] = time.monotonic()


def _cursor(job: JobStatus) -> str:
    """A job's place in the list, oldest first: its creation time, then its id."""
    return f"{job.created_at:017.6f}:{job.id}"


def _check_paths_on_head_node(spec: JobSpec) -> None:
    """Refuse at submit a token file that does not exist where the service runs (the head
    node): on a cluster it must be on storage every node mounts, the head node included."""
    if spec.data.kind == "token_file" and spec.data.path:
        path = Path(spec.data.path).expanduser()
        if not path.is_file():
            raise SpecError([FieldError(("data", "path"), (
                f"{spec.data.path} is not a readable file on the service's node"
                f"{' (it does not exist)' if not path.exists() else ''}. To fix: give the "
                "absolute path of a token file on storage every node mounts"))])


def _alive_nodes(with_resources: set[str] | None = None) -> set[str]:
    """Ids of alive Ray nodes (that carry one of `with_resources`, if given)."""
    return {node["NodeID"] for node in ray.nodes() if node["Alive"] and (
        not with_resources or with_resources & set(node["Resources"]))}


def _hard_stop(run: _Run) -> None:
    """Kill a job's runner (Ray's ownership takes the controller and workers with it) and
    remove its worker group's placement group, which Ray would otherwise free only through
    its dashboard-backed cleaner."""
    ray.kill(run.runner, no_restart=True)
    if run.placement_group:
        remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(run.placement_group)))


def _describe_failure(exc: BaseException) -> str:
    """The root cause of a failed fit: a raytrain error's own message when a worker raised one
    (it says how to fix it), else the last lines of the worker's error, not Ray's whole
    traceback."""
    root = _root_cause(exc)
    if isinstance(root, RaytrainError):
        return str(root)[:2000]
    text = str(root).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    tail = "\n".join(lines[-6:]) if lines else type(root).__name__
    return f"training failed: {tail}"[:2000]


def _root_cause(exc: BaseException) -> BaseException:
    """Unwrap Ray's task error and Ray Train's worker-group error down to what a rank raised
    (the lowest rank's, when several did)."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        failures = getattr(exc, "worker_failures", None)
        if isinstance(failures, dict) and failures:
            exc = failures[min(failures)]
            continue
        cause = getattr(exc, "cause", None) or getattr(exc, "controller_failure", None)
        if isinstance(cause, BaseException):
            exc = cause
            continue
        break
    return exc


JobManagerActor = ray.remote(JobManager)


def get_or_create_manager(config: ServiceConfig) -> ActorHandle:
    """The service's job manager: the running one, or a new one on the head node."""
    return JobManagerActor.options(
        name=MANAGER_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        # Ray restarts a lost manager (its process killed, its node's worker crashed): the new
        # one reloads the store, reclaims what the old one's runs held, and resumes their jobs.
        max_restarts=-1,
        num_cpus=0,
        max_concurrency=64,
        resources={HEAD_NODE_RESOURCE: 0.001},
    ).remote(config.model_dump(mode="json"))


def find_manager() -> ActorHandle | None:
    try:
        return ray.get_actor(MANAGER_NAME, namespace=NAMESPACE)
    except ValueError:
        return None
