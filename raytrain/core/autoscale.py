"""The autoscaling policy: which offer, how many nodes, which market and how often to
checkpoint, chosen by expected cost (or time) to finish, and re-decided on events.

Pure: offers, a throughput function (the planner's prediction per offer and node count),
the policy and what has been observed go in; a `Decision` with its reason comes out. The job
manager and the simulator carry decisions out; neither decides anything itself.

Expected time to finish (a first-order model: preemptions are a Poisson process, one at a time):
W seconds of training at the option's throughput, a checkpoint every tau seconds costing C, and
preemptions at rate L = nodes x lambda. Each preemption costs the restart R and, unless its
notice let the job checkpoint first (a share q of them), the work since the last checkpoint,
tau / 2 on average. So T = W (1 + C / tau) + L T (R + (1 - q) tau / 2), that is

    T = W (1 + C / tau) / (1 - L (R + (1 - q) tau / 2))

and its optimum over tau (`optimal_interval_s`) is Young's interval sqrt(2 C / ((1 - q) L))
with Daly's -C correction when C and R are small against the time between preemptions. The
option is infeasible when the denominator is not positive: it would lose work faster than it
makes it. Cost is T times the hourly price of all its nodes: nodes are billed while
training, checkpointing and restarting (an upper bound, since a preempted node stops billing
while its replacement is sought).

    decision = choose(goal, offers, planner_throughput(dims, work), policy)
    decision = redecide(current, "preemption", goal, offers, throughput, policy, observed)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

from raytrain.catalog.shapes import usd_for
from raytrain.spec import DecisionRecord, JobStatus, Offer, PolicySpec

# tokens/s and a description of the layout for an offer and a node count; None: nothing fits.
Throughput = Callable[[Offer, int], "tuple[float, str] | None"]

NODE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class Goal:
    """What is left of a job: its tokens, and the time and money it may still use."""

    tokens_left: float
    deadline_s: float | None = None  # seconds from now
    budget_usd: float | None = None  # dollars left
    max_usd_per_hour: float | None = None
    markets: tuple[str, ...] = ("spot", "on-demand")  # the job's own restriction


@dataclass(frozen=True)
class Observed:
    """Preemptions seen per offer (count, spot node-hours held) and capacity found missing."""

    spot_history: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    preemptions: int = 0  # of this job, all offers
    unavailable: frozenset[tuple[str, str]] = frozenset()  # (offer id, market)

    def rate(self, offer: Offer, prior_node_hours: float) -> float:
        """Interruptions per node-hour: the catalog's rate as a prior worth `prior_node_hours`
        of observation, updated by what this service has seen (a gamma-Poisson mean)."""
        count, hours = self.spot_history.get(offer.id, (0, 0.0))
        prior = offer.spot_interruptions_per_hour
        return (prior * prior_node_hours + count) / (prior_node_hours + hours)


@dataclass(frozen=True)
class Option:
    offer: Offer
    market: str
    nodes: int
    tokens_per_s: float
    layout: str
    usd_per_hour: float  # all nodes
    preemptions_per_hour: float  # all nodes
    checkpoint_interval_s: float | None  # None: no preemption risk, the job's own interval
    expected_s: float
    expected_cost_usd: float

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.offer.id, self.market, self.nodes)

    @property
    def expected_hours(self) -> float:
        return self.expected_s / 3600

    def describe(self) -> str:
        return (f"{self.nodes} x {self.offer.instance_type} {self.market} "
                f"(${self.usd_per_hour:,.2f}/h, {self.layout})")


@dataclass(frozen=True)
class Decision:
    action: str  # start | stay | switch | wait
    option: Option | None
    reason: str
    at_checkpoint: bool = False  # switch at the next checkpoint rather than now


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


def checkpoint_interval_s(policy: PolicySpec, preemptions_per_s: float) -> float | None:
    """The policy's checkpoint interval at a preemption rate (all nodes): its own fixed one,
    else the optimum (`optimal_interval_s`), at most max_checkpoint_interval_s; with no risk,
    its fixed one or None (the job's own checkpoint_every_steps)."""
    if preemptions_per_s == 0:
        return policy.checkpoint_interval_s
    interval = policy.checkpoint_interval_s or optimal_interval_s(
        policy.checkpoint_cost_s, preemptions_per_s, policy.restart_s, policy.notice_coverage)
    return None if interval is None else min(interval, policy.max_checkpoint_interval_s)


def time_in_hand_s(goal: Goal, fastest_s: float, policy: PolicySpec) -> float:
    """How long the job could still wait before it must move to an option taking fastest_s
    to finish: the deadline less that option's time with the margin and the fallback's
    slack (inf without a deadline)."""
    if goal.deadline_s is None:
        return math.inf
    return goal.deadline_s - fastest_s * (1 + policy.deadline_margin) - policy.fallback_slack_s


def evaluate_option(offer: Offer, market: str, nodes: int, tokens_per_s: float, layout: str,
                    goal: Goal, policy: PolicySpec, observed: Observed) -> Option:
    price = offer.usd_per_hour(market)
    assert price is not None, f"{offer.id} has no {market} price"
    rate_per_hour = nodes * observed.rate(offer, policy.prior_node_hours) if market == "spot" \
        else 0.0
    rate_per_s = rate_per_hour / 3600
    restart_s = policy.restart_s if rate_per_s else 0.0
    interval = checkpoint_interval_s(policy, rate_per_s)
    work_s = goal.tokens_left / tokens_per_s
    expected = expected_time_s(work_s, rate_per_s, interval, policy.checkpoint_cost_s,
                               restart_s, policy.notice_coverage)
    return Option(offer, market, nodes, tokens_per_s, layout, price * nodes, rate_per_hour,
                  interval, expected, usd_for(price, expected, nodes))


def options(goal: Goal, offers: Iterable[Offer], throughput: Throughput, policy: PolicySpec,
            observed: Observed = Observed(), markets: tuple[str, ...] | None = None
            ) -> list[Option]:
    """Every option that can hold the job, under the hourly cap, cheapest expected cost first."""
    allowed = [m for m in (markets or tuple(policy.markets)) if m in goal.markets]
    found = []
    for offer in offers:
        for market in (m for m in offer.markets() if m in allowed):
            hourly = offer.usd_per_hour(market) or 0.0
            most = min(policy.max_nodes, offer.max_nodes or policy.max_nodes)
            for nodes in (n for n in NODE_COUNTS if n <= most):
                if goal.max_usd_per_hour is not None and hourly * nodes > goal.max_usd_per_hour:
                    break
                fit = throughput(offer, nodes)
                if fit is None:
                    continue
                found.append(evaluate_option(offer, market, nodes, fit[0], fit[1], goal, policy,
                                             observed))
    found.sort(key=lambda o: (o.expected_cost_usd, o.expected_s))
    return found


def choose(goal: Goal, offers: Iterable[Offer], throughput: Throughput, policy: PolicySpec,
           observed: Observed = Observed()) -> Decision:
    """The best option for the job now, by the policy's objective, within deadline and budget.

        choose(Goal(tokens_left=1e9, deadline_s=86400), offers, throughput, policy)
    """
    markets = tuple(policy.markets)
    failed_over = (policy.failover_after_preemptions is not None
                   and observed.preemptions >= policy.failover_after_preemptions)
    if failed_over:
        markets = ("on-demand",)
    every = options(goal, offers, throughput, policy, observed, markets)
    usable = [o for o in every if math.isfinite(o.expected_s)
              and (o.offer.id, o.market) not in observed.unavailable]
    if not usable:
        why = "no offer can hold the job" if not every else \
            "every offer that holds the job is unavailable or loses work faster than it trains"
        return Decision("wait", None, f"{why} (markets {', '.join(markets)}"
                        + (f", under ${goal.max_usd_per_hour:,.2f}/h" if goal.max_usd_per_hour
                           else "") + ")")
    notes = []
    if failed_over:
        notes.append(f"on-demand after {observed.preemptions} preemption(s)")
    if goal.budget_usd is not None:
        affordable = [o for o in usable if o.expected_cost_usd <= goal.budget_usd]
        if affordable:
            usable = affordable
        else:
            notes.append(f"no option fits the ${goal.budget_usd:,.0f} budget left; the cheapest")
            usable = [min(usable, key=lambda o: o.expected_cost_usd)]
    late: Option | None = None  # the fastest option, when others are tried past the deadline
    if goal.deadline_s is not None:
        margin = 1 + policy.deadline_margin
        in_time = [o for o in usable if o.expected_s * margin <= goal.deadline_s]
        quickest = min(usable, key=lambda o: o.expected_s)
        if time_in_hand_s(goal, quickest.expected_s, policy) > 0:
            late = quickest  # time in hand: a cheaper option may be tried, and left later
        elif in_time:  # no time in hand: no gamble on preemptions if anything is safe
            usable = [o for o in in_time if o.preemptions_per_hour == 0] or in_time
        else:
            notes.append(f"nothing finishes {policy.deadline_margin:.0%} before the deadline "
                         f"({goal.deadline_s / 3600:.1f} h left); the fastest")
            usable = [quickest]
    if policy.objective == "time":
        best = min(usable, key=lambda o: (o.expected_s, o.expected_cost_usd))
    else:
        best = min(usable, key=lambda o: (_tried_cost(o, late, goal, policy), o.expected_s))
    if late is not None and goal.deadline_s is not None and \
            best.expected_s * (1 + policy.deadline_margin) > goal.deadline_s:
        notes.append(f"expected past the deadline, with time in hand to fall back to "
                     f"{late.describe()} ({late.expected_hours:.2f} h) while "
                     f"{policy.fallback_slack_s / 3600:.2f} h of slack remain")
    return Decision("start", best, _account(best, policy, notes))


def _tried_cost(option: Option, fallback: Option | None, goal: Goal,
               policy: PolicySpec) -> float:
    """An option's expected cost to finish; for one expected to finish late, tried while
    `fallback` (the fastest) still has time in hand, the cost of the share of the work it
    does before the slack is gone plus the rest on the fallback."""
    margin = 1 + policy.deadline_margin
    if fallback is None or goal.deadline_s is None or \
            option.expected_s * margin <= goal.deadline_s:
        return option.expected_cost_usd
    room = time_in_hand_s(goal, fallback.expected_s, policy)
    share = min(1.0, max(0.0, room / max(option.expected_s - fallback.expected_s * margin,
                                         1e-9)))
    return share * option.expected_cost_usd + (1 - share) * fallback.expected_cost_usd


def _account(best: Option, policy: PolicySpec, notes: list[str]) -> str:
    text = (f"{best.describe()}: expected {best.expected_hours:.2f} h, "
            f"${best.expected_cost_usd:,.2f} to finish")
    if best.market == "spot":
        text += (f", {best.preemptions_per_hour:.3g} preemptions/h, checkpoint every "
                 f"{best.checkpoint_interval_s or 0:.0f} s")
    text += f"; by {policy.objective} ({policy.name})"
    return text + ("; " + "; ".join(notes) if notes else "")


def redecide(current: Option, event: str, goal: Goal, offers: list[Offer],
             throughput: Throughput, policy: PolicySpec, observed: Observed) -> Decision:
    """Re-decide a running (or preempted) job on an event: 'preemption', 'capacity-missing',
    'progress' (checks the deadline) or 'prices'. Stays unless moving pays or is forced.

        redecide(option, "progress", goal, offers, throughput, policy, observed)
    """
    best = choose(goal, offers, throughput, policy, observed)
    if best.option is None:
        return Decision("wait", None, best.reason)
    offer = next((o for o in offers if o.id == current.offer.id
                  and o.usd_per_hour(current.market) is not None), current.offer)
    now = evaluate_option(offer, current.market, current.nodes, current.tokens_per_s,
                          current.layout, goal, policy, observed)
    if best.option.key == now.key:
        return Decision("stay", now, f"still the best: {best.reason}")
    if event in ("preemption", "capacity-missing") or \
            (current.offer.id, current.market) in observed.unavailable or \
            current.market not in _markets_now(policy, observed):
        # The job is stopped anyway (or must leave): moving costs nothing extra.
        return Decision("switch", best.option, f"{event}: {best.reason}")
    if goal.deadline_s is not None and \
            now.expected_s * (1 + policy.deadline_margin) > goal.deadline_s and \
            best.option.expected_s < now.expected_s and \
            time_in_hand_s(goal, best.option.expected_s, policy) \
            <= (now.checkpoint_interval_s or 0.0):
        return Decision("switch", best.option, f"behind the deadline on {now.describe()} "
                        f"(expected {now.expected_hours:.2f} h of {goal.deadline_s / 3600:.2f} "
                        f"h left): {best.reason}", at_checkpoint=True)
    move_usd = usd_for(best.option.usd_per_hour, policy.restart_s)
    saving = now.expected_cost_usd - best.option.expected_cost_usd - move_usd
    if saving > policy.switch_min_saving * now.expected_cost_usd and saving > 0:
        return Decision("switch", best.option, f"saves ${saving:,.2f} of "
                        f"${now.expected_cost_usd:,.2f} after the move's "
                        f"${move_usd:,.2f}: {best.reason}", at_checkpoint=True)
    return Decision("stay", now, f"moving to {best.option.describe()} would save too little "
                    f"(expected ${now.expected_cost_usd:,.2f} here)")


def _markets_now(policy: PolicySpec, observed: Observed) -> tuple[str, ...]:
    if policy.failover_after_preemptions is not None and \
            observed.preemptions >= policy.failover_after_preemptions:
        return ("on-demand",)
    return tuple(policy.markets)


def with_history(observed: Observed, offer_id: str, preempted: int, node_hours: float
                 ) -> Observed:
    """`observed` plus `node_hours` of spot on an offer, `preempted` times."""
    count, hours = observed.spot_history.get(offer_id, (0, 0.0))
    history = dict(observed.spot_history)
    history[offer_id] = (count + preempted, hours + node_hours)
    return replace(observed, spot_history=history, preemptions=observed.preemptions + preempted)


def with_measurements(policy: PolicySpec, job: JobStatus) -> PolicySpec:
    """The policy told what the job has measured, in place of its assumed figures: the latest
    checkpoint's save time, and the mean time from new capacity to the first step over its
    resumes after preemptions."""
    update: dict[str, float] = {}
    if job.checkpoint is not None and job.checkpoint.save_s:
        update["checkpoint_cost_s"] = job.checkpoint.save_s
    restarts = [p.capacity_to_first_step_s for p in job.preemption_log
                if p.capacity_to_first_step_s is not None]
    if restarts:
        update["restart_s"] = sum(restarts) / len(restarts)
    return policy.model_copy(update=update) if update else policy


def interval_moved(before: float | None, after: float | None, by: float = 0.25) -> bool:
    """Whether a checkpoint interval changed enough (a fraction `by`) to tell the job."""
    if before is None or after is None:
        return before != after
    return abs(after - before) > by * before


def decision_record(now: float, event: str, decision: Decision) -> DecisionRecord:
    """A decision as the job's status keeps it."""
    option = decision.option
    return DecisionRecord(
        time=now, event=event, action=decision.action,
        offer=option.offer.id if option else None, market=option.market if option else None,
        nodes=option.nodes if option else 0,
        usd_per_hour=option.usd_per_hour if option else 0.0,
        expected_hours=option.expected_hours if option else None,
        expected_cost_usd=option.expected_cost_usd if option else None,
        checkpoint_interval_s=option.checkpoint_interval_s if option else None,
        reason=decision.reason)
