"""The job manager's scheduling pass, run every ServiceConfig.scheduler_interval_s: notice
runners that returned, start queued jobs that fit (a fixed cluster: raytrain.core.queue's
backfill; an autoscaling one: each job on nodes the policy buys for it), let the policy look
at running jobs again, and keep node requests from expiring.

Every decision here is a pure function's (core.capacity, core.autoscale, core.lifecycle);
this module gathers their inputs from the cluster adaptor, feeds the results to the job
manager as lifecycle events, and starts runners.

    scheduler = Scheduler(manager)
    scheduler.pass_once()      # what the scheduler thread does, also callable from tests
"""

from __future__ import annotations

import logging
import math
from contextlib import AbstractContextManager
from typing import Any, Mapping, Protocol

from raytrain.cloud.interruption import watch_endpoint
from raytrain.cloud.object_store import is_remote, join
from raytrain.core import lifecycle as lc
from raytrain.core.billing import attribute
from raytrain.core.elastic import run_groups
from raytrain.core.queue import Queued, admit, backfill, worker_group_demand
from raytrain.serve.adaptors.cluster import Cluster
from raytrain.serve.jobs.node_requests import REQUEST_REFRESH_S
from raytrain.serve.jobs.provisioning import Provisioner
from raytrain.spec import JobSpec, JobState, PlanSummary, ServiceConfig

logger = logging.getLogger(__name__)


class Jobs(Protocol):
    """What the scheduler needs of the job manager (serve.jobs.manager.JobManager, checked in
    tests/support/adaptors_conform.py): every job's record, read and changed only under `lock`; the
    runners' handles; the adaptors it holds; and `apply`, which feeds a job's lifecycle an
    event and carries out what it decides."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    records: dict[str, lc.Record]
    handles: dict[str, Any]
    cluster: Cluster[Any]
    config: ServiceConfig
    provisioner: Provisioner

    def apply(self, job_id: str, event: lc.Event) -> Any: ...


class Scheduler:
    def __init__(self, manager: Jobs) -> None:
        self.manager = manager
        self.cluster = manager.cluster
        self.config = manager.config
        self.provisioner = manager.provisioner

    def pass_once(self) -> None:
        self.reap_finished()
        self.start_queued()
        self.review_running()
        self.bill_nodes()
        self.provisioner.refresh(self.cluster.now())

    def idle_until(self, now: float) -> float:
        """Until when passes from `now` on would do nothing (`now` itself: this one would
        act), given that neither the cloud nor any job changes meanwhile but for progress
        reports (JobManager.lifecycle_changes): no runner returned or overstayed its stop, no job
        waiting for its nodes reaches its capacity wait or its noticed nodes' grace (nodes
        coming up are a change), no review or price change is due, no node request needs
        renewing, and the nodes each job holds are as the last pass left them. A trace replay
        (raytrain.sim.replay) skips those passes: 9 in 10 over a replayed week."""
        manager, provisioner = self.manager, self.provisioner
        until = math.inf
        with manager.lock:
            if self.cluster.finished(dict(manager.handles)):
                return now
            for job_id, record in manager.records.items():
                run = record.run
                if lc.waiting(record):  # _start_on_bought_nodes acts when one falls due
                    placement = provisioner.placements.get(job_id)
                    if not provisioner.enabled or placement is None:
                        return now  # it decides (again) every pass
                    if record.leaving is not None:  # the noticed nodes' grace
                        until = min(until, record.leaving[0])
                    until = min(until, placement.requested_at + provisioner.policy_for(
                        record.status.spec).capacity_wait_s)
                    continue
                if run is not None and run.stop_by is not None:
                    until = min(until, run.stop_by)
                if provisioner.enabled and record.status.state == JobState.RUNNING and \
                        run is not None and run.moving_to is None and not run.over_budget:
                    until = min(until, run.reviewed_at + self.config.review_interval_s)
            for placement in provisioner.placements.values():
                if placement.requesting:
                    until = min(until, placement.sent_at + REQUEST_REFRESH_S)
        if provisioner.enabled and provisioner.catalog_changed():
            return now
        # A millisecond early: the passes compare differences (now - reviewed_at >= ...),
        # which may round the other way than a sum; a pass too many does nothing.
        until -= 1e-3
        return until if until > now else now

    def bill_nodes(self) -> None:
        """Tell each job with bought capacity which nodes it holds now (core.billing), so it
        is billed for each from when it is up to when it goes."""
        provisioner, manager = self.provisioner, self.manager
        with manager.lock:
            wants = {job_id: (p.node_type, p.nodes + p.extra, p.option.node_usd_per_hour)
                     for job_id, p in provisioner.placements.items()
                     if job_id in manager.records
                     and not manager.records[job_id].status.state.is_terminal}
            for job_id, record in manager.records.items():  # no placement now: let them go
                if record.held and job_id not in wants:
                    price = next(iter(record.held.values()))[1]
                    wants[job_id] = ("", 0, price)
        if not wants:
            return
        alive = {kind: self.cluster.alive_nodes({kind}) for kind in {w[0] for w in wants.values()}}
        everything = self.cluster.alive_nodes()  # a moving job's old nodes too
        with manager.lock:
            records = manager.records
            held = {job_id: frozenset(records[job_id].held) for job_id in wants
                    if job_id in records}
            runs = {job_id: records[job_id].run for job_id in held}
            using = {job_id: run.nodes & everything for job_id, run in runs.items()
                     if run is not None}
            now_held = attribute(held, {j: (w[0], w[1]) for j, w in wants.items() if j in held},
                                 alive, using)
            for job_id, nodes in now_held.items():
                if nodes != held[job_id]:
                    manager.apply(job_id, lc.NodesHeld(nodes, wants[job_id][2]))

    def reap_finished(self) -> None:
        """Feed each returned runner's outcome to its job; stop groups past their grace."""
        manager = self.manager
        with manager.lock:
            handles = dict(manager.handles)
        done = self.cluster.finished(handles)
        outcomes = {job_id: self.cluster.outcome(handles[job_id]) for job_id in done}
        alive = self.cluster.alive_nodes() if done else frozenset()
        now = self.cluster.now()
        with manager.lock:
            for job_id, error in outcomes.items():
                if manager.handles.get(job_id) is handles[job_id]:
                    manager.apply(job_id, lc.RunEnded(error, alive))
            for job_id, record in list(manager.records.items()):
                run = record.run
                if run is not None and run.stop_by is not None and now > run.stop_by:
                    logger.warning("job %s did not stop within its grace after being "
                                   "cancelled; killing it", job_id)
                    manager.apply(job_id, lc.StopOverdue())

    def start_queued(self) -> None:
        manager = self.manager
        with manager.lock:
            if not any(lc.waiting(record) for record in manager.records.values()):
                return  # nothing waits: spare the GCS a resource query every tick
        total = self.cluster.total_resources()
        with manager.lock:
            records = manager.records
            held = [r.run.demand for r in records.values() if r.run is not None]
            queue = [r.status for r in records.values() if lc.waiting(r)]
            if self.provisioner.enabled:  # each job gets nodes of its own: no queue
                for job in queue:
                    self._start_on_bought_nodes(job.id, total, held)
                return
            demands = {job.id: worker_group_demand(job.spec.resources.num_workers,
                                                   job.spec.resources.cpus_per_worker,
                                                   job.spec.resources.gpus_per_worker)
                       for job in queue}
            decided = backfill([Queued(job.id, demands[job.id], records[job.id].passed)
                                for job in queue], total, held,
                               self.config.max_backfill_passes)
            for job_id in decided.passed:
                manager.apply(job_id, lc.Passed())
            for job in queue:
                if job.id in decided.waiting:
                    manager.apply(job.id, lc.Queued(decided.waiting[job.id]))
                    continue
                if job.plan is None:  # every job is planned at submit
                    raise RuntimeError(f"job {job.id} has no plan")
                self._launch(job.id, job.spec, job.plan, demands[job.id],
                             notice_endpoint=watch_endpoint(
                                 self.config.interruption_endpoint, "local", None))

    def _start_on_bought_nodes(self, job_id: str, total: dict[str, float],
                               held: list[Mapping[str, float]]) -> None:
        """An autoscaled job: decide and request its nodes, start it once they are up, and
        decide again if they do not come in time."""
        manager, provisioner, now = self.manager, self.provisioner, self.cluster.now()
        record = manager.records[job_id]
        if record.leaving is not None and lc.noticed_nodes_present(
                record, now, self.cluster.alive_nodes()):
            return  # after a notice: let the noticed nodes go before resuming
        placement, decided = provisioner.place(record.status, now)
        if decided is not None:
            manager.apply(job_id, decided)
        if placement is not None and now - placement.requested_at > \
                provisioner.policy_for(record.status.spec).capacity_wait_s:
            placement, decided = provisioner.capacity_missing(manager.records[job_id].status,
                                                              now)
            if decided is not None:
                manager.apply(job_id, decided)
        if placement is None:
            return
        resources = placement.spec.resources
        demand = {**worker_group_demand(placement.workers, resources.cpus_per_worker,
                                        resources.gpus_per_worker), **placement.demand}
        if not admit(demand, total, held).fits:
            return
        self._launch(job_id, placement.spec, placement.plan, demand, placement.worker_resources,
                     f"{placement.nodes} x {placement.node_type}, "
                     f"{placement.plan.description}",
                     watch_endpoint(self.config.interruption_endpoint, placement.option.market,
                                    placement.option.offer.provider),
                     usd_per_hour=placement.option.usd_per_hour)
        # The nodes are up; Ray Train asks for them itself as its controller starts. Two
        # requests at once would count them twice and buy a spare node.
        provisioner.nodes_up(job_id, now)
        provisioner.handed_over(job_id)
        held.append(demand)

    def _launch(self, job_id: str, spec: JobSpec, plan: PlanSummary, demand: dict[str, float],
                worker_resources: dict[str, float] | None = None, describe: str = "",
                notice_endpoint: str | None = None, usd_per_hour: float = 0.0) -> None:
        root = self.config.job_uri(job_id)
        # Ray Train's own run folder (its controller's state, on the head node) stays on a
        # folder: with a bucket, the state directory holds it.
        ray_root = str(self.config.state_path / "runs" / job_id) if is_remote(root) \
            else join(root, "ray")
        handle = self.cluster.launch(job_id, spec, plan.layout,
                                     self.config.checkpoints_uri(job_id),
                                     ray_root, worker_resources, notice_endpoint)
        self.manager.handles[job_id] = handle
        bought = set(worker_resources or ())
        self.manager.apply(job_id, lc.Launched(lc.Run(
            demand=demand, launched_at=self.cluster.now(), usd_per_hour=usd_per_hour,
            describe=describe or plan.description,
            nodes_at_launch=self.cluster.alive_nodes(bought) if bought else frozenset(),
            budget_usd=spec.capacity.budget_usd or self.config.max_usd_per_job,
            groups=run_groups(spec, plan.layout, worker_resources)), plan))
        logger.info("job %s launched with %s", job_id, demand)

    def review_running(self) -> None:
        """Let the policy look at running jobs on bought capacity again: when the offers
        change (a cheaper one may pay for the move) and every review_interval_s (the
        deadline). A move happens at a checkpoint taken for it."""
        if not self.provisioner.enabled:
            return
        manager, now = self.manager, self.cluster.now()
        with manager.lock:
            prices_changed = self.provisioner.reload_if_changed()
            for job_id, record in list(manager.records.items()):
                run = record.run
                if record.status.state != JobState.RUNNING or run is None \
                        or run.moving_to is not None or run.over_budget:
                    continue
                if not (prices_changed or now - run.reviewed_at >= self.config.review_interval_s):
                    continue
                placement, decided = self.provisioner.review(
                    record.status, now, "prices" if prices_changed else "progress")
                if placement is None or decided is None:  # stays: maybe a new interval
                    manager.apply(job_id, lc.Reviewed(decided.decision if decided else None))
                    continue
                manager.apply(job_id, lc.Reviewed(
                    decided.decision, decided.resources,
                    f"{placement.nodes} x {placement.node_type}"))

    def reclaim_after_restart(self) -> None:
        """What a lost manager's runs left behind: their runner actors and their worker
        groups' placement groups, which nothing else frees (Ray Train's cleaner needs the
        dashboard's state API). Jobs that were in flight are queued again and resume from
        their checkpoints."""
        self.cluster.reclaim_runners()
        self.reclaim_groups()

    def reclaim_groups(self) -> None:
        """Remove training placement groups no run holds, when none of the runs is still
        starting (a starting run's group is not known yet)."""
        with self.manager.lock:
            owned = {r.run.placement_group for r in self.manager.records.values()
                     if r.run is not None}
        if None in owned:
            return
        self.cluster.reclaim_groups({g for g in owned if g}, self.config.node_types)
