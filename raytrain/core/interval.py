"""How long a job takes under preemptions, and how often it should checkpoint: the math the
autoscaling policy (raytrain.core.autoscale) ranks options and sets intervals by.

Expected time to finish (a first-order model: preemptions are a Poisson process, one at a time):
W seconds of training at the option's throughput, a checkpoint every tau seconds stalling C, and
preemptions at rate L = nodes x lambda. Each preemption costs R, a new node and the group's
start on it (ready + restart, raytrain.core.costs), and, unless its notice let the job
checkpoint first (a share q of them: the offer's cloud's share when its notice covers a durable
checkpoint), the work since the last checkpoint, tau / 2 on average. So
T = W (1 + C / tau) + L T (R + (1 - q) tau / 2), that is

    T = W (1 + C / tau) / (1 - L (R + (1 - q) tau / 2))

plus, for capacity the job does not hold yet, one start (ready + restart). Its optimum over tau
(`optimal_interval_s`) is Young's interval sqrt(2 C / ((1 - q) L)) with Daly's -C correction
when C and R are small against the time between preemptions. The option is infeasible when the
denominator is not positive: it would lose work faster than it makes it. Cost is T times the
hourly price of all its nodes, which are billed while training, checkpointing and restarting.

    optimal_interval_s(60, 1 / 3600)   # ~598 s
"""

from __future__ import annotations

import math

from raytrain.core.costs import Costs, notice_coverage, policy_costs
from raytrain.spec import Offer, PolicySpec


def optimal_interval_s(checkpoint_cost_s: float, preemptions_per_s: float,
                       restart_s: float = 0.0, notice_coverage: float = 0.0) -> float | None:
    """The checkpoint interval that minimises `expected_time_s`; None if no preemption loses
    work. Setting its derivative to zero gives tau = sqrt(C^2 + 2 C (1 - L R) / L') - C with
    L' = (1 - q) L: Young's sqrt(2 C / L') when C and R are small against 1 / L, with Daly's
    -C correction.

        optimal_interval_s(60, 1 / 3600)   # ~598 s
    """
    losing = preemptions_per_s * (1.0 - notice_coverage)
    if losing <= 0:
        return None
    spare = max(1.0 - preemptions_per_s * restart_s, 1e-9)
    c = checkpoint_cost_s
    return math.sqrt(c * c + 2.0 * c * spare / losing) - c


def expected_time_s(work_s: float, preemptions_per_s: float, interval_s: float | None,
                    checkpoint_cost_s: float, restart_s: float,
                    notice_coverage: float = 0.0) -> float:
    """Expected wall time to do `work_s` of training under preemptions (module docstring);
    inf when preemptions would undo work faster than it is done."""
    overhead = 1.0 + (checkpoint_cost_s / interval_s if interval_s else 0.0)
    lost_per_preemption = restart_s + (1.0 - notice_coverage) * (interval_s or 0.0) / 2.0
    useful = 1.0 - preemptions_per_s * lost_per_preemption
    return work_s * overhead / useful if useful > 0 else math.inf


def checkpoint_interval_s(policy: PolicySpec, preemptions_per_s: float,
                          costs: Costs | None = None, offer: Offer | None = None
                          ) -> float | None:
    """The policy's checkpoint interval at a preemption rate (all nodes): its own fixed one,
    else the optimum (`optimal_interval_s`) for the costs, at most max_checkpoint_interval_s;
    with no risk, its fixed one or None (the job's own checkpoint_every_steps)."""
    if preemptions_per_s == 0:
        return policy.checkpoint_interval_s
    costs = costs or policy_costs(policy)
    lost_s = costs.lost_per_preemption_s(offer) if offer else costs.restart_s
    coverage = notice_coverage(offer, costs) if offer else 0.0
    interval = policy.checkpoint_interval_s or optimal_interval_s(
        costs.checkpoint_s, preemptions_per_s, lost_s, coverage)
    return None if interval is None else min(interval, policy.max_checkpoint_interval_s)


def interval_moved(before: float | None, after: float | None, by: float = 0.25) -> bool:
    """Whether a checkpoint interval changed enough (a fraction `by`) to tell the job."""
    if before is None or after is None:
        return before != after
    return abs(after - before) > by * before
