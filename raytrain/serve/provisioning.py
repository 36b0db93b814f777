"""Buying capacity for jobs on an autoscaling cluster: the job manager's link between the
policy (raytrain.core.autoscale, which decides) and Ray's autoscaler (which launches).

For a queued job the provisioner asks the policy for an offer, market and node count among
the node types the operator bound to offers (ServiceConfig.node_types), records the decision
with its reason, and asks the autoscaler for that many nodes of the node type. The job starts
when the nodes are there; its workers ask for a share of the node type's own resource, so they
land on exactly those nodes. If the nodes do not come within the policy's capacity_wait_s,
that offer and market are marked unavailable for the job and the policy decides again. When
the job ends its request is withdrawn and the autoscaler lets the idle nodes go.

`ray.autoscaler.sdk.request_resources` replaces the previous request each time, so one
object keeps the whole cluster's request: the union of every job's node bundles.

    provisioner = Provisioner(config)
    placement = provisioner.place(job, now)     # Placement, or None while it waits (job.message says why)
    provisioner.release(job.id)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from raytrain.catalog import load_offers, load_policies, parse_offers
from raytrain.core.autoscale import (
    Observed,
    Option,
    choose,
    job_goal,
    job_throughput,
    redecide,
)
from raytrain.errors import FieldError
from raytrain.spec import (
    DecisionRecord,
    JobSpec,
    JobStatus,
    Offer,
    OfferCatalog,
    PolicySpec,
    Resources,
    ServiceConfig,
)

logger = logging.getLogger(__name__)


@dataclass
class Placement:
    """Where a job runs: `nodes` nodes of `node_type`, `workers` workers spread evenly."""

    node_type: str
    nodes: int
    workers: int
    option: Option
    spec: JobSpec  # the job's spec with its worker count and accelerator set to the choice
    requested_at: float
    unavailable: frozenset[tuple[str, str]] = frozenset()

    @property
    def worker_resources(self) -> dict[str, float]:
        """The share of the node type's resource each worker asks for (1 per node)."""
        return {self.node_type: round(self.nodes / self.workers, 4)}

    @property
    def demand(self) -> dict[str, float]:
        return {self.node_type: float(self.nodes)}


def _ray_request(bundles: list[dict[str, float]]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=bundles)


@dataclass
class Provisioner:
    config: ServiceConfig
    request: Callable[[list[dict[str, float]]], None] = _ray_request
    catalog: OfferCatalog = field(init=False)
    policies: dict[str, PolicySpec] = field(init=False)
    placements: dict[str, Placement] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.catalog = catalog_for(self.config)
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
        if name is None or name in self.policies:
            return None
        return FieldError(("capacity", "policy"), f"no policy named {name!r}. To fix: use one "
                          "of " + ", ".join(sorted(self.policies)))

    def policy_for(self, spec: JobSpec) -> PolicySpec:
        return self.policies[spec.capacity.policy or self.config.default_policy]

    def place(self, job: JobStatus, now: float) -> Placement | None:
        """The job's placement, deciding (and requesting nodes) on the first call; None while
        the policy finds nothing (job.message says why)."""
        placement = self.placements.get(job.id)
        if placement is not None:
            return placement
        return self._decide(job, now, "submit", frozenset())

    def capacity_missing(self, job: JobStatus, now: float) -> Placement | None:
        """The nodes did not come in time: mark that offer and market unavailable for the job
        and decide again."""
        old = self.placements[job.id]
        unavailable = old.unavailable | {(old.option.offer.id, old.option.market)}
        return self._decide(job, now, "capacity-missing", unavailable, old.option)

    def release(self, job_id: str) -> None:
        if self.placements.pop(job_id, None) is not None:
            self._apply()

    def _bound_offers(self) -> tuple[list[Offer], dict[tuple[str, str], str]]:
        """Offers as the bindings allow them: a market without a node type has no price."""
        by_offer: dict[str, dict[str, str]] = {}
        for name, binding in self.config.node_types.items():
            by_offer.setdefault(binding.offer, {})[binding.market] = name
        offers, node_type = [], {}
        for offer_id, markets in by_offer.items():
            offer = self.catalog.find(offer_id)
            if offer is None:
                continue
            update = {f"{'spot' if m == 'spot' else 'on_demand'}_usd_per_hour": None
                      for m in ("spot", "on-demand") if m not in markets}
            priced = offer.model_copy(update=update)
            if priced.markets():
                offers.append(priced)
                node_type.update({(offer_id, m): n for m, n in markets.items()})
        return offers, node_type

    def _decide(self, job: JobStatus, now: float, event: str,
                unavailable: frozenset[tuple[str, str]], current: Option | None = None
                ) -> Placement | None:
        spec, policy = job.spec, self.policy_for(job.spec)
        offers, node_type = self._bound_offers()
        throughput = _limit_nodes(job_throughput(spec), self.config, node_type)
        observed = Observed(unavailable=unavailable, preemptions=job.preemptions)
        goal = job_goal(spec, job.checkpoint.step if job.checkpoint else 0,
                        now - job.created_at, job.cost_usd)
        decision = (redecide(current, event, goal, offers, throughput, policy, observed)
                    if current is not None else choose(goal, offers, throughput, policy,
                                                       observed))
        option = decision.option
        job.decisions.append(DecisionRecord(
            time=now, event=event, action=decision.action,
            offer=option.offer.id if option else None, market=option.market if option else None,
            nodes=option.nodes if option else 0,
            usd_per_hour=option.usd_per_hour if option else 0.0,
            expected_hours=option.expected_hours if option else None,
            expected_cost_usd=option.expected_cost_usd if option else None,
            checkpoint_interval_s=option.checkpoint_interval_s if option else None,
            reason=decision.reason,
        ))
        logger.info("job %s %s: %s %s", job.id, event, decision.action, decision.reason)
        self.placements.pop(job.id, None)
        if option is None:
            job.message = f"no capacity to buy: {decision.reason}"
            self._apply()
            return None
        offer = option.offer
        devices = option.nodes * offer.gpus_per_node
        resources = spec.resources
        on_gpu = resources.use_gpu
        run_spec = JobSpec.model_validate({**spec.model_dump(), "resources": {
            **resources.model_dump(), "num_workers": devices,
            "accelerator": offer.gpu_kind if on_gpu else None}})
        placement = Placement(node_type[(offer.id, option.market)], option.nodes, devices,
                              option, run_spec, now, unavailable)
        self.placements[job.id] = placement
        job.resources = Resources(
            accelerator=offer.gpu_kind, node_type=placement.node_type, offer=offer.id,
            market=option.market,  # type: ignore[arg-type]
            nodes=option.nodes, gpus=devices * resources.gpus_per_worker if on_gpu else 0.0,
            cpus=devices * resources.cpus_per_worker, hourly_usd=option.usd_per_hour)
        job.message = f"requested {option.nodes} x {placement.node_type} from the autoscaler"
        self._apply()
        return placement

    def _apply(self) -> None:
        bundles = [{p.node_type: 1.0} for p in self.placements.values() for _ in range(p.nodes)]
        self.request(bundles)


def _limit_nodes(throughput: Callable[[Offer, int], tuple[float, str] | None],
                 config: ServiceConfig, node_type: dict[tuple[str, str], str]
                 ) -> Callable[[Offer, int], tuple[float, str] | None]:
    """No more nodes of an offer than its node types' max_workers allow."""
    limits: dict[str, int] = {}
    for (offer_id, _), name in node_type.items():
        cap = config.node_types[name].max_nodes or 10**9
        limits[offer_id] = min(limits.get(offer_id, cap), cap)
    return lambda offer, nodes: (None if nodes > limits.get(offer.id, 10**9)
                                 else throughput(offer, nodes))


def catalog_for(config: ServiceConfig) -> OfferCatalog:
    """The offers the service uses: its offers_file, else the refreshed cache, else the
    shipped snapshot."""
    if config.offers_file:
        path = Path(config.offers_file).expanduser()
        return parse_offers({**yaml.safe_load(path.read_text()), "source": "file"}, str(path))
    return load_offers(config.state_path)
