"""Buying capacity for jobs on an autoscaling cluster: the job manager's link between the
policy (raytrain.core.autoscale, which decides) and Ray's autoscaler (which launches).

For a queued job the provisioner asks the policy for an offer, market and node count among
the node types the operator bound to offers (ServiceConfig.node_types), records the decision
with its reason, and asks the autoscaler for that many nodes of the node type. The job starts
when the nodes are there; its workers ask for a share of the node type's own resource, so they
land on exactly those nodes. If the nodes do not come within the policy's capacity_wait_s,
that offer and market are marked unavailable for the job and the policy decides again. When
the job ends its request is withdrawn and the autoscaler lets the idle nodes go.

Requests go to the autoscaler through the cluster adaptor (serve.adaptors.ray_cluster says how and
why). They cover a job from the decision until its worker group has started, and again from
a preemption until it resumes (while the group runs, Ray Train's own request holds the
nodes); they expire unless refreshed, so a lost job manager cannot hold nodes forever. Their
books (placements, requests sent, node-ready times) are serve.jobs.node_requests'.

    provisioner = Provisioner(config, request=cluster.request_nodes)
    placement, decided = provisioner.place(job, now)
    # placement: where it runs, or None while nothing fits; decided: the decision made now
    # (a lifecycle CapacityDecided event for the job), or None if it was made before
    provisioner.release(job.id)

The provisioner keeps only its own books (placements; the offers' spot history is the job
manager's tally's); it reads a job's status and never changes it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from raytrain.catalog.hardware import CATALOG, Catalog
from raytrain.core.autoscale import Decision, Observed, Option, Throughput, decision_record, options
from raytrain.core.costs import Costs, costs_shown, job_costs
from raytrain.core.engine import CapacityEngine, EngineEvent, Missing
from raytrain.core.interval import interval_moved
from raytrain.core.lifecycle import CapacityDecided
from raytrain.core.offers_answer import offers_response
from raytrain.core.resolve import plan_summary
from raytrain.core.spending import within_service_limits
from raytrain.core.throughput import device_mismatch, job_goal, job_throughput, limit_nodes
from raytrain.errors import FieldError, SpecError
from raytrain.serve.jobs.admission import check_fits_the_cluster
from raytrain.serve.jobs.node_requests import NodeRequests, Placement
from raytrain.spec import (
    JobCosts,
    JobSpec,
    JobStatus,
    Offer,
    OfferCatalog,
    PlanSummary,
    PolicySpec,
    Resources,
    ServiceConfig,
)
from raytrain.spec.files import (
    catalog_for,
    load_policies,
    offers_path,
    unknown_policy,
)

logger = logging.getLogger(__name__)


# The placement the job has now (None: nothing fits), and the decision made by this call.
Decided = tuple[Placement | None, CapacityDecided | None]

PLANNED_KEPT = 256  # jobs whose planned throughput is kept (Provisioner._throughput)


@dataclass
class Provisioner(NodeRequests):
    config: ServiceConfig
    # Sends the job's node request to the autoscaler ([] withdraws): the cluster
    # adaptor's request_nodes.
    request: Callable[[str, list[dict[str, float]]], None]
    catalog: OfferCatalog = field(init=False)
    policies: dict[str, PolicySpec] = field(init=False)
    placements: dict[str, Placement] = field(default_factory=dict)
    # Spot preemptions this service has seen per offer: (count, node-hours held on spot), as
    # the job manager's tally counts them (core.tally), across restarts.
    history: dict[str, tuple[int, float]] = field(default_factory=dict)
    # Node-ready times measured per offer: (samples, total seconds), the tally's too.
    ready: dict[str, tuple[int, float]] = field(default_factory=dict)
    # The devices the planner prices jobs on (this machine's CPU profile, if calibrated).
    hardware: Catalog = CATALOG
    # How a job is planned on the capacity bought (raytrain.core.resolve.plan_summary).
    planner: Callable[..., PlanSummary] = plan_summary

    def __post_init__(self) -> None:
        # Each job's planned throughput (job_throughput, which memoises each device shape's
        # plan), by its spec: a review decides again every few minutes on the same devices.
        self._planned: dict[int, tuple[JobSpec, Throughput]] = {}
        self.catalog = catalog_for(self.config)
        self._offers_file = str(offers_path(self.config))  # stat every pass: no Path parsing
        self._catalog_stamp = self._stamp()
        self._bound = self._bound_offers()
        folder = Path(self.config.policy_dir).expanduser() if self.config.policy_dir else None
        self.policies = load_policies(folder)
        missing = [f"{name} -> {b.offer}" for name, b in self.config.node_types.items()
                   if self.catalog.find(b.offer) is None]
        if missing:
            logger.warning("node types bound to offers the catalog lacks (never chosen): %s",
                           ", ".join(missing))

    @property
    def enabled(self) -> bool:
        return bool(self.config.node_types)

    def policy_error(self, spec: JobSpec) -> FieldError | None:
        name = spec.capacity.policy
        return None if name is None else unknown_policy(name, self.policies)

    def _throughput(self, spec: JobSpec, node_type: dict[tuple[str, str], str]) -> Throughput:
        """The planner's throughput for the job on this service's devices and node types."""
        held = self._planned.pop(id(spec), None)  # the spec kept: its id is not reused
        if held is None:
            held = (spec, job_throughput(spec, self.hardware))  # memoised per layout
        self._planned[id(spec)] = held
        while len(self._planned) > PLANNED_KEPT:
            self._planned.pop(next(iter(self._planned)))
        return limit_nodes(held[1], self._node_limits(node_type))

    def offers(self, spec: JobSpec | None, policy: str | None, keep: int) -> dict[str, Any]:
        """The catalog, and with a spec the ranking of `policy` (default: the job's, else
        the service's); SpecError for a policy it does not have."""
        name = policy or (spec.capacity.policy if spec else None) or self.config.default_policy
        error = unknown_policy(name, self.policies, ("policy",))
        if error is not None:
            raise SpecError([error])
        catalog = self.catalog.with_pods({self.config.node_types[n].offer
                                          for n in self.config.pod_types})
        response = offers_response(catalog, self.policies[name], spec, keep,
                                   Observed(spot_history=dict(self.history)), self.hardware)
        return response.model_dump(mode="json")

    def check_capacity(self, spec: JobSpec, nodes: Callable[[], Any]) -> None:
        """Raise SpecError at submit for a job no capacity can ever hold: an unknown policy,
        more than the hourly ceiling alone, or (on a fixed cluster, `nodes()` its nodes'
        resources) a worker group no node set fits."""
        error = self.policy_error(spec)
        if error is None and self.enabled:
            error = self.holding_error(spec)
        if error is not None:
            raise SpecError([error])
        if not self.enabled:
            check_fits_the_cluster(spec, nodes())

    def holding_error(self, spec: JobSpec) -> FieldError | None:
        """Why no node type this service may buy can ever hold the job (whatever the prices,
        deadline or budget), or None: such a job would wait forever."""
        offers, node_type = self._bound
        reason = device_mismatch(spec, offers)
        if reason is None:
            throughput = self._throughput(spec, node_type)
            goal = replace(job_goal(spec), deadline_s=None, budget_usd=None,
                           max_usd_per_hour=None)
            found = options(goal, offers, throughput, self.policy_for(spec))
            ceiling = self.config.max_usd_per_hour
            cheapest = min((o.usd_per_hour for o in found), default=None)
            if cheapest is not None and (ceiling is None or cheapest <= ceiling):
                return None
            if cheapest is not None:
                return FieldError(("resources",), (
                    f"the cheapest capacity that holds this job costs ${cheapest:,.2f}/h, "
                    f"over this service's ceiling of ${ceiling:,.2f}/h for all jobs "
                    "together. To fix: use fewer or smaller workers, or ask the operator to "
                    "raise max_usd_per_hour"))
            names = ", ".join(sorted(node_type.values())) or "none"
            reason = (f"no node type this service buys ({names}) can hold the job's "
                      f"{spec.resources.num_workers} workers as laid out. To fix: change "
                      "resources or parallel to fit those nodes, or add a node type that "
                      "fits to the cluster config")
        return FieldError(("resources",), reason)

    def policy_for(self, spec: JobSpec) -> PolicySpec:
        return self.policies[spec.capacity.policy or self.config.default_policy]

    def place(self, job: JobStatus, now: float) -> Decided:
        """The job's placement, deciding (and requesting nodes) on the first call; None while
        the policy finds nothing (the decision says why)."""
        placement = self.placements.get(job.id)
        if placement is not None:
            return placement, None
        return self._decide(job, now, EngineEvent.SUBMIT, {})

    def capacity_missing(self, job: JobStatus, now: float) -> Decided:
        """The nodes did not come in time: decide again (the engine keeps waiting while a
        deadline leaves time in hand, else drops that offer and market for the job)."""
        old = self.placements[job.id]
        return self._decide(job, now, EngineEvent.CAPACITY_MISSING, old.missing, old.option)

    def preempted(self, job: JobStatus, now: float) -> Decided:
        """The job's nodes were taken (the tally has counted it against the offer's spot
        rate): decide where it resumes (the same kind of nodes, or the next best)."""
        old = self.placements.get(job.id)
        if old is None:
            return self.place(job, now)
        return self._decide(job, now, EngineEvent.PREEMPTION, old.missing, old.option)

    def _bound_offers(self) -> tuple[list[Offer], dict[tuple[str, str], str]]:
        """One offer per bound node type, priced in its market only (so that each node
        type's max_workers limits its own market)."""
        offers: list[Offer] = []
        node_type: dict[tuple[str, str], str] = {}
        for name, binding in self.config.node_types.items():
            offer = self.catalog.find(binding.offer)
            if offer is None or offer.usd_per_hour(binding.market) is None:
                continue
            other = "on_demand_usd_per_hour" if binding.market == "spot" else "spot_usd_per_hour"
            served = offer.served_by_pods() if name in self.config.pod_types else offer
            offers.append(served.model_copy(update={other: None}))
            node_type[(offer.id, binding.market)] = name
        return offers, node_type

    def review(self, job: JobStatus, now: float, event: str) -> Decided:
        """Decide again for a running job ('progress': the deadline and the preemption rate;
        'prices': the catalog changed); a new placement when the policy moves it, (None, the
        decision) when it stays with a checkpoint interval that moved, else (None, None)."""
        old = self.placements.get(job.id)
        if old is None:
            return None, None
        decision, _, costs = self._decision(job, now, EngineEvent(event), old.missing,
                                            old.option)
        if decision.action == "stay" and decision.option is not None and \
                interval_moved(old.option.checkpoint_interval_s,
                               decision.option.checkpoint_interval_s):
            old.option = decision.option  # the same capacity: checkpoint at its new interval
            return None, CapacityDecided(decision_record(now, event, decision), None, "",
                                         self._shown(costs, job, decision))
        if decision.action != "switch":
            return None, None
        return self._adopt(job, now, EngineEvent(event), old.missing, decision, costs)

    def _stamp(self) -> float | None:
        """When this service's offers file last changed (None: there is none, the shipped
        snapshot): spec.files.catalog_stamp on a path worked out once."""
        try:
            return os.stat(self._offers_file).st_mtime
        except FileNotFoundError:
            return None

    def catalog_changed(self) -> bool:
        """Whether the offers' file changed since they were read (reload_if_changed reads
        them again)."""
        return self._stamp() != self._catalog_stamp

    def reload_if_changed(self) -> bool:
        """Read the offers again if their file changed (a refresh, or an operator's edit)."""
        stamp = self._stamp()
        if stamp == self._catalog_stamp:
            return False
        self._catalog_stamp = stamp
        self.catalog = catalog_for(self.config)
        self._bound = self._bound_offers()
        return True

    def costs_for(self, job: JobStatus) -> Costs:
        """The figures the policy prices the job with (raytrain.core.costs)."""
        return job_costs(self.policy_for(job.spec), job, self.ready,
                         self.config.review_interval_s)

    def _decision(self, job: JobStatus, now: float, event: EngineEvent, missing: Missing,
                  current: Option | None) -> tuple[Decision, Missing, Costs]:
        """The engine's decision, the capacity it now counts missing, and the costs it used."""
        spec, policy = job.spec, self.policy_for(job.spec)
        costs = self.costs_for(job)
        offers, node_type = self._bound
        throughput = self._throughput(spec, node_type)
        engine = CapacityEngine(policy, offers, throughput, self.history, current, missing,
                                job.preemptions, costs)
        goal = job_goal(spec, job.checkpoint.step if job.checkpoint else 0,
                        now - job.created_at, job.cost_usd)
        if policy.max_regret is not None and job.reference_usd is not None:
            allowed = max(policy.max_regret * job.reference_usd, policy.regret_floor_usd)
            goal = replace(goal, cap_usd=max(0.0, job.reference_usd + allowed - job.cost_usd))
        others = sum(p.option.usd_per_hour for other, p in self.placements.items()
                     if other != job.id)
        goal, ceiling = within_service_limits(goal, self.config.max_usd_per_hour, others,
                                              self.config.max_usd_per_job, job.cost_usd)
        decision = engine.on(event if current is not None else EngineEvent.SUBMIT, goal, now)
        if decision.option is None and ceiling:
            decision = replace(decision, reason=f"{decision.reason}; {ceiling}")
        return decision, engine.missing, costs

    def _reference_usd(self, job: JobStatus, costs: Costs) -> float | None:
        """On-demand from the start: the regret cap's reference (None: no on-demand offer)."""
        offers, node_type = self._bound
        throughput = self._throughput(job.spec, node_type)
        found = options(job_goal(job.spec), offers, throughput, self.policy_for(job.spec),
                        markets=("on-demand",), costs=costs)
        return min((o.expected_cost_usd for o in found), default=None)

    def _shown(self, costs: Costs, job: JobStatus, decision: Decision) -> JobCosts:
        offer: str | None
        if decision.option is not None:
            offer, market = decision.option.offer.id, decision.option.market
        else:
            offer, market = job.resources.offer, job.resources.market
        return costs_shown(costs, self.policy_for(job.spec), job, offer, market)

    def _decide(self, job: JobStatus, now: float, event: EngineEvent, missing: Missing,
                current: Option | None = None) -> Decided:
        decision, missing, costs = self._decision(job, now, event, missing, current)
        return self._adopt(job, now, event, missing, decision, costs)

    def _adopt(self, job: JobStatus, now: float, event: EngineEvent, missing: Missing,
               decision: Decision, costs: Costs) -> Decided:
        spec = job.spec
        _, node_type = self._bound
        option = decision.option
        record = decision_record(now, EngineEvent(event).value, decision)
        logger.info("job %s %s: %s %s", job.id, EngineEvent(event).value, decision.action,
                    decision.reason)
        old = self.placements.pop(job.id, None)
        shown = self._shown(costs, job, decision)
        reference = self._reference_usd(job, costs) if job.reference_usd is None else None
        if option is None:
            self.request(job.id, [])
            return None, CapacityDecided(record, None, f"no capacity to buy: {decision.reason}",
                                         shown, reference)
        offer = option.offer
        devices = option.nodes * offer.gpus_per_node
        resources = spec.resources
        on_gpu = resources.use_gpu
        run_spec, plan = self._planned_on(job, devices, offer.gpu_kind if on_gpu else None)
        placement = Placement(node_type[(offer.id, option.market)], option.nodes, devices,
                              option, run_spec, plan, now, missing)
        same_nodes = old is not None and old.node_type == placement.node_type
        placement.asked_at = old.asked_at if old is not None and same_nodes and old.asked_at \
            else now
        self.placements[job.id] = placement
        held = Resources(
            accelerator=offer.gpu_kind, node_type=placement.node_type, offer=offer.id,
            market=option.market,
            nodes=option.nodes, gpus=devices * resources.gpus_per_worker if on_gpu else 0.0,
            cpus=devices * resources.cpus_per_worker, usd_per_hour=option.usd_per_hour)
        self._send(job.id, placement, now)
        return placement, CapacityDecided(
            record, held, f"requested {option.nodes} x {placement.node_type} from the autoscaler",
            shown, reference)

    def _planned_on(self, job: JobStatus, devices: int, accelerator: str | None
                    ) -> tuple[JobSpec, PlanSummary]:
        """The job's spec and plan on `devices` workers of `accelerator`: the plan stored at
        submit when that is what it assumed, else one re-plan through the same function
        (stored with the job by the lifecycle when the capacity comes)."""
        spec, resources = job.spec, job.spec.resources
        if job.plan is not None and devices == resources.num_workers and \
                accelerator == resources.accelerator:
            return spec, job.plan
        run_spec = spec.model_copy(update={"resources": resources.model_copy(
            update={"num_workers": devices, "accelerator": accelerator})})
        run_spec = JobSpec.model_validate(run_spec.model_dump())  # checked on what it holds
        return run_spec, self.planner(run_spec, hardware=self.hardware)

    def _node_limits(self, node_type: dict[tuple[str, str], str]) -> dict[tuple[str, str], int]:
        # Each (offer, market)'s node limit: its node type's max_workers.
        return {key: self.config.node_types[name].max_nodes or 10**9
                for key, name in node_type.items()}
