"""The provisioner's requests to the autoscaler, per job: where a job runs (a Placement: the
node type and count the policy chose, with the plan on them), the request sent for it and
renewed before it expires (serve.adaptors.ray_cluster), handed over to Ray Train's own request
once the worker group is up, raised for an elastic job's replacements, withdrawn at the end;
and the node-ready time measured when the nodes come. serve.jobs.provisioning decides; this
keeps the books of what was asked for.

    class Provisioner(NodeRequests): ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from raytrain.core.autoscale import Option
from raytrain.core.costs import ready_key
from raytrain.core.engine import Missing
from raytrain.spec import JobSpec, PlanSummary, PolicySpec

REQUEST_REFRESH_S = 60.0  # requests are sent again this often (they expire: ray_cluster)


@dataclass
class Placement:
    """Where a job runs: `nodes` nodes of `node_type`, `workers` workers spread evenly."""

    node_type: str
    nodes: int
    workers: int
    option: Option
    spec: JobSpec  # the job's spec with its worker count and accelerator set to the choice
    plan: PlanSummary  # its layout on that capacity, decided here once
    requested_at: float  # when this decision asked for the nodes (the wait runs from here)
    missing: Missing = field(default_factory=dict)  # capacity found missing, and when
    requesting: bool = True  # False while the job's worker group holds the nodes
    sent_at: float = 0.0
    asked_at: float = 0.0  # when nodes of this type were first asked for, since the job last
    # had them up (the node-ready time is measured from here)
    extra: int = 0  # replacements bought ahead for an elastic job's leaving nodes
    lost: int = 0  # an elastic job's nodes lost without a notice, their replacements asked for

    @property
    def worker_resources(self) -> dict[str, float]:
        """The share of the node type's resource each worker asks for (1 per node)."""
        return {self.node_type: round(self.nodes / self.workers, 4)}

    @property
    def demand(self) -> dict[str, float]:
        return {self.node_type: float(self.nodes)}


class NodeRequests:
    """The requests of Provisioner, over the books it keeps (its dataclass fields)."""

    request: Callable[[str, list[dict[str, float]]], None]
    placements: dict[str, Placement]
    ready: dict[str, tuple[int, float]]

    if TYPE_CHECKING:
        def policy_for(self, spec: JobSpec) -> PolicySpec: ...  # Provisioner.policy_for

    def handed_over(self, job_id: str) -> None:
        """The job's worker group is up: Ray Train's request holds the nodes now."""
        placement = self.placements.get(job_id)
        if placement is not None and placement.requesting:
            placement.requesting = False
            self.request(job_id, [])

    def replace(self, job_id: str, leaving: int, now: float, lost: int = 0) -> None:
        """An elastic job's nodes are being taken (`leaving` of them, on a notice: still up)
        or were lost (`lost`, without one). Ask for the job's nodes and the leaving ones'
        replacements at once (a request is for the cluster's whole size, so the job's own
        count buys the lost ones' replacements, and its count plus the leaving ones buys
        theirs now); 0 and 0, once the replacements heal: withdraw (the groups' worker groups
        hold their nodes)."""
        placement = self.placements.get(job_id)
        if placement is None or (placement.extra, placement.lost) == (leaving, lost):
            return
        placement.extra, placement.lost = leaving, lost
        placement.requesting = leaving + lost > 0
        if placement.requesting:
            placement.asked_at = placement.asked_at or now
            self._send(job_id, placement, now)
        else:
            self.request(job_id, [])

    def refresh(self, now: float) -> None:
        """Renew requests before they expire (call it every scheduling pass)."""
        for job_id, placement in self.placements.items():
            if placement.requesting and now - placement.sent_at > REQUEST_REFRESH_S:
                self._send(job_id, placement, now)

    def release(self, job_id: str) -> None:
        if self.placements.pop(job_id, None) is not None:
            self.request(job_id, [])

    def nodes_up(self, job_id: str, now: float) -> None:
        """The job's nodes are all up: the time since they were asked for is a measured
        node-ready time for the offer in its market (the policy's ready_s from now on), up to
        capacity_wait_s: a longer wait is capacity the market lacked, which the capacity-
        missing rule prices, not a cloud's time to bring up nodes it has (counted whole, one
        start that waited hours would price every later preemption at those hours)."""
        placement = self.placements.get(job_id)
        if placement is None or not placement.asked_at:
            return
        key = ready_key(placement.option.offer.id, placement.option.market)
        count, total = self.ready.get(key, (0, 0.0))
        waited = min(max(0.0, now - placement.asked_at),
                     self.policy_for(placement.spec).capacity_wait_s)
        self.ready[key] = (count + 1, total + waited)
        placement.asked_at = 0.0

    def _send(self, job_id: str, placement: Placement, now: float) -> None:
        placement.sent_at = now
        count = placement.nodes + placement.extra
        self.request(job_id, [{placement.node_type: 1.0}] * count)
