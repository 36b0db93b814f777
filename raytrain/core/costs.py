"""What a checkpoint and a preemption cost a job, in seconds, as the policy prices them: the
service's measurements where it has them, the policy file's assumptions until then.

- `checkpoint_s`: how long one checkpoint stalls training (the Young/Daly interval is priced
  on it);
- `durable_s`: from the start of a checkpoint to its being durable (what a notice must
  cover for the job to lose nothing);
- `restart_s`: from capacity in hand to the first training step (measured on every start of
  the job's worker group);
- `ready_s`: from asking for nodes to their being up, per offer and market (measured by the
  service across jobs, kept with its tally): a spot request's includes waiting for capacity
  the market does not have, which an on-demand request of the same offer does not wait for.

A preemption that stops the whole group costs ready_s + restart_s, plus the work since the
last checkpoint unless the offer's notice (its cloud's seconds and share, raytrain.catalog)
was long enough to checkpoint on: `notice_coverage`.

    costs = job_costs(policy, job, ready_by_offer)      # the live service and the replay alike
    costs.lost_per_preemption_s(offer)                   # ready + restart
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from raytrain.spec import CostFigure, JobCosts, JobStatus, Offer, PolicySpec


@dataclass(frozen=True)
class Costs:
    checkpoint_s: float
    durable_s: float
    restart_s: float
    default_ready_s: float
    ready_s: Mapping[str, float] = field(default_factory=dict)  # measured, per ready_key
    measured: frozenset[str] = frozenset()  # "checkpoint", "restart", "ready:<ready_key>"
    review_s: float = 300.0  # how long a change can go unnoticed (the service's reviews)
    group_stall_s: float = 5.0  # elastic: survivors' stall when a group leaves or joins
    replace_s: float | None = None  # elastic: loss to replacement training (None: new node
    # ready + restart)

    def ready_for(self, offer_id: str, market: str = "spot") -> float:
        key = ready_key(offer_id, market)
        return self.ready_s.get(key, self.ready_s.get(offer_id, self.default_ready_s))

    def ready_measured(self, offer_id: str, market: str = "spot") -> bool:
        return bool({f"ready:{ready_key(offer_id, market)}", f"ready:{offer_id}"}
                    & self.measured)

    def lost_per_preemption_s(self, offer: Offer) -> float:
        """What one preemption of a rigid group costs besides lost work: a new spot node,
        and the start of the group on it."""
        return self.ready_for(offer.id) + self.restart_s

    def group_loss_s(self, offer: Offer, groups: int) -> float:
        """What losing one of `groups` replica groups costs an elastic job, in seconds of
        its whole time: the survivors' stalls (it leaves, its replacement joins), and the
        lost group's share of the time until its replacement trains."""
        replace_s = self.replace_s if self.replace_s is not None else \
            self.lost_per_preemption_s(offer)
        return 2 * self.group_stall_s + replace_s / groups

    def describe(self, offer_id: str | None = None, market: str = "spot") -> str:
        """The figures with where each comes from, for a decision's reason."""
        def said(name: str, value: float, measured: bool) -> str:
            return f"{name} {value:.3g} s {'measured' if measured else 'assumed'}"
        parts = [said("checkpoint", self.checkpoint_s, "checkpoint" in self.measured),
                 said("restart", self.restart_s, "restart" in self.measured)]
        if offer_id is not None:
            parts.append(said(f"{market} nodes ready", self.ready_for(offer_id, market),
                              self.ready_measured(offer_id, market)))
        return ", ".join(parts)


def ready_key(offer_id: str, market: str) -> str:
    """The key of an offer's measured node-ready time in one market (a tally kept before
    markets were told apart has bare offer ids: `Costs.ready_for` still reads those)."""
    return f"{offer_id}@{market}"


def policy_costs(policy: PolicySpec, review_s: float = 300.0) -> Costs:
    """The policy's assumptions alone (nothing measured yet)."""
    return Costs(policy.checkpoint_cost_s, policy.checkpoint_cost_s, policy.restart_s,
                 policy.ready_s, review_s=review_s, group_stall_s=policy.group_stall_s)


def notice_coverage(offer: Offer, costs: Costs) -> float:
    """The share of the offer's preemptions whose notice leaves time to make a checkpoint
    durable (no work lost): its cloud's share when the notice is at least that long, else 0."""
    seconds, share = offer.notice
    return share if seconds > 0 and seconds >= costs.durable_s else 0.0


def job_costs(policy: PolicySpec, job: JobStatus | None,
              ready: Mapping[str, tuple[int, float]] | None = None,
              review_s: float = 300.0) -> Costs:
    """The costs the policy prices `job` with: its measured checkpoint stall, durable time
    and restart where it has them, the service's measured node-ready time per offer
    (`ready`: ready_key -> (samples, total seconds)), else the policy's assumptions."""
    measured: set[str] = set()
    costs = policy_costs(policy)
    checkpoint, durable, restart = costs.checkpoint_s, costs.durable_s, costs.restart_s
    stall, replace_s = costs.group_stall_s, None
    if job is not None:
        figures = job.costs
        if figures.group_stall_s.samples:
            stall = figures.group_stall_s.measured_s or 0.0
            measured.add("group stall")
        if figures.replace_s.samples:
            replace_s = figures.replace_s.measured_s
            measured.add("replace")
        if figures.checkpoint_stall_s.samples:
            checkpoint = figures.checkpoint_stall_s.measured_s or 0.0
            measured.add("checkpoint")
        if figures.checkpoint_durable_s.samples:
            durable = figures.checkpoint_durable_s.measured_s or 0.0
        if figures.restart_s.samples:
            restart = figures.restart_s.measured_s or 0.0
            measured.add("restart")
    per_offer = {offer: total / count for offer, (count, total) in (ready or {}).items()
                 if count > 0}
    measured.update(f"ready:{offer}" for offer in per_offer)
    return Costs(checkpoint, max(durable, checkpoint), restart, policy.ready_s, per_offer,
                 frozenset(measured), review_s, stall, replace_s)


def costs_shown(costs: Costs, policy: PolicySpec, job: JobStatus,
                offer_id: str | None, market: str = "spot") -> JobCosts:
    """The job's status's view of the costs: each figure assumed, measured and used."""
    figures = job.costs

    def figure(old: CostFigure, assumed: float, used: float) -> CostFigure:
        return old.model_copy(update={"assumed_s": assumed, "used_s": used})

    ready_used = costs.ready_for(offer_id, market) if offer_id else policy.ready_s
    ready_measured = offer_id is not None and costs.ready_measured(offer_id, market)
    return JobCosts(
        checkpoint_stall_s=figure(figures.checkpoint_stall_s, policy.checkpoint_cost_s,
                                  costs.checkpoint_s),
        checkpoint_durable_s=figure(figures.checkpoint_durable_s, policy.checkpoint_cost_s,
                                    costs.durable_s),
        restart_s=figure(figures.restart_s, policy.restart_s, costs.restart_s),
        ready_s=figures.ready_s.model_copy(update={
            "assumed_s": policy.ready_s, "used_s": ready_used,
            **({"measured_s": ready_used} if ready_measured else {})}),
        group_stall_s=figure(figures.group_stall_s, policy.group_stall_s,
                             costs.group_stall_s),
        replace_s=figures.replace_s.model_copy(update={
            "used_s": costs.replace_s, "assumed_s": (
                costs.ready_for(offer_id) if offer_id else policy.ready_s) + costs.restart_s}))
