"""The autoscaling policy: which offer, how many nodes, which market and how often to
checkpoint, chosen by expected cost (or time) to finish, and re-decided on events.

Pure: offers, a throughput function (the planner's prediction per offer and node count),
the policy and what has been observed go in; a `Decision` with its reason comes out. The job
manager and the simulator carry decisions out; neither decides anything itself.

Expected time to finish, and the checkpoint interval that minimises it: raytrain.core.interval.

Two promises bound the gamble on spot. A deadline the policy accepts is met: a risky option is
held only while the fastest risk-free one could still finish after the worst case the policy
can know (a whole interval of work lost, a new node and a restart, and a review's delay in
noticing). And a job never pays more than on-demand would have from the start by more than
`PolicySpec.max_regret`: a risky option is held only while the money spent, what it may spend
until the next decision, and on-demand to the end stay under that cap (Goal.cap_usd).

    decision = choose(goal, offers, planner_throughput(dims, work), policy)
    decision = redecide(current, "preemption", goal, offers, throughput, policy, observed)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

from raytrain.catalog.prices import usd_for
from raytrain.core.costs import Costs, notice_coverage, policy_costs
from raytrain.core.interval import checkpoint_interval_s, expected_time_s
from raytrain.spec import DecisionRecord, Offer, PolicySpec
from raytrain.spec.offers import Action

# tokens/s and a description of the layout for an offer and a node count (and, optionally,
# the replica groups that can train on without each other there); None: nothing fits.
Throughput = Callable[[Offer, int], "tuple[float, str] | tuple[float, str, int] | None"]

NODE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class Goal:
    """What is left of a job: its tokens, and the time and money it may still use.
    `cap_usd`: the most it may still spend by the regret promise (module doc); None: no cap."""

    tokens_left: float
    deadline_s: float | None = None  # seconds from now
    budget_usd: float | None = None  # dollars left
    max_usd_per_hour: float | None = None
    markets: tuple[str, ...] = ("spot", "on-demand")  # the job's own restriction
    cap_usd: float | None = None


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
    reserve_s: float = 0.0  # the worst case a risky option must leave room for (module doc)
    groups: int = 1  # replica groups that train on without each other (1: rigid)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.offer.id, self.market, self.nodes)

    @property
    def expected_hours(self) -> float:
        return self.expected_s / 3600

    @property
    def node_usd_per_hour(self) -> float:
        """One node's price in its market (the offer's figure, not all nodes' divided)."""
        return self.offer.usd_per_hour(self.market) or 0.0

    @property
    def risky(self) -> bool:
        return self.preemptions_per_hour > 0

    def describe(self) -> str:
        return (f"{self.nodes} x {self.offer.instance_type} {self.market} "
                f"(${self.usd_per_hour:,.2f}/h, {self.layout})")


@dataclass(frozen=True)
class Decision:
    action: Action
    option: Option | None
    reason: str
    at_checkpoint: bool = False  # switch at the next checkpoint rather than now


def evaluate_option(offer: Offer, market: str, nodes: int, tokens_per_s: float, layout: str,
                    goal: Goal, policy: PolicySpec, observed: Observed,
                    costs: Costs | None = None, held: bool = False,
                    max_interval_s: float | None = None, groups: int = 1) -> Option:
    """One option priced (module doc); `held`: the job trains there already (no start);
    `max_interval_s`: checkpoint at least this often (a guard's bound, below); `groups`:
    replica groups that train on without each other (elastic; 1: rigid)."""
    costs = costs or policy_costs(policy)
    price = offer.usd_per_hour(market)
    assert price is not None, f"{offer.id} has no {market} price"
    rate_per_hour = nodes * observed.rate(offer, policy.prior_node_hours) if market == "spot" \
        else 0.0
    rate_per_s = rate_per_hour / 3600
    # Elastic: a preemption takes one group and the others train on; only losing all of
    # them at once stops the job, which is assumed to be one preemption in `groups`.
    whole_per_s = rate_per_s / groups if groups > 1 else rate_per_s
    lost_s = costs.lost_per_preemption_s(offer) if rate_per_s else 0.0
    coverage = notice_coverage(offer, costs)
    interval = checkpoint_interval_s(policy, whole_per_s, costs, offer)
    if max_interval_s is not None and interval is not None:
        interval = min(interval, max_interval_s)
    start_s = 0.0 if held else costs.ready_for(offer.id, market) + costs.restart_s
    work_s = goal.tokens_left / tokens_per_s
    if groups > 1 and rate_per_s:  # group losses slow it a little: fold them into the work
        slowed = 1.0 - (rate_per_s - whole_per_s) * costs.group_loss_s(offer, groups)
        work_s = work_s / slowed if slowed > 0 else math.inf
    expected = start_s + expected_time_s(work_s, whole_per_s, interval, costs.checkpoint_s,
                                         lost_s, coverage)
    reserve = 0.0
    if rate_per_s:  # a whole interval lost, a new start, and a review before it is seen
        reserve = (interval or 0.0) + costs.checkpoint_s + lost_s + costs.review_s
    return Option(offer, market, nodes, tokens_per_s, layout, price * nodes, rate_per_hour,
                  interval, expected, usd_for(price, expected, nodes), reserve, groups)


def options(goal: Goal, offers: Iterable[Offer], throughput: Throughput, policy: PolicySpec,
            observed: Observed = Observed(), markets: tuple[str, ...] | None = None,
            costs: Costs | None = None, held: tuple[str, str, int] | None = None
            ) -> list[Option]:
    """Every option that can hold the job, under the hourly cap, cheapest expected cost first;
    `held`: the key of the option the job trains on now (priced without a start)."""
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
                found.append(evaluate_option(
                    offer, market, nodes, fit[0], fit[1], goal, policy, observed, costs,
                    held == (offer.id, market, nodes),
                    groups=fit[2] if len(fit) > 2 else 1))
    found.sort(key=lambda o: (o.expected_cost_usd, o.expected_s))
    return found


def time_in_hand_s(goal: Goal, fastest_s: float, policy: PolicySpec,
                   reserve_s: float = 0.0) -> float:
    """How long the job could still wait (or gamble, leaving `reserve_s` for the worst case)
    before it must move to an option taking fastest_s to finish: the deadline less that
    option's time with the margin, the reserve and the fallback's slack (inf without one)."""
    if goal.deadline_s is None:
        return math.inf
    return goal.deadline_s - fastest_s * (1 + policy.deadline_margin) - reserve_s \
        - policy.fallback_slack_s


def choose(goal: Goal, offers: Iterable[Offer], throughput: Throughput, policy: PolicySpec,
           observed: Observed = Observed(), costs: Costs | None = None,
           held: tuple[str, str, int] | None = None) -> Decision:
    """The best option for the job now, by the policy's objective, within deadline, budget and
    the regret cap; `held`: the option it trains on now, if any.

        choose(Goal(tokens_left=1e9, deadline_s=86400), offers, throughput, policy)
    """
    offers = list(offers)
    markets = tuple(policy.markets)
    failed_over = (policy.failover_after_preemptions is not None
                   and observed.preemptions >= policy.failover_after_preemptions)
    if failed_over:
        markets = ("on-demand",)
    every = options(goal, offers, throughput, policy, observed, markets, costs, held)
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
    # The fallback as it would be after a risky option's worst case: capacity to get again.
    fresh = {o.key: o for o in (every if held is None else options(
        goal, offers, throughput, policy, observed, markets, costs))}
    safe = min((fresh[o.key] for o in usable if not o.risky), key=lambda o: o.expected_s,
               default=None)
    # Back to risk from safe capacity only with room for two worst cases, not one: the room
    # left after a fallback is the room that made the job fall back.
    now = next((o for o in every if o.key == held), None)
    share = 0.5 if now is not None and not now.risky else 1.0
    if safe is not None:
        guarded = [_within_guards(o, safe, goal, policy, observed, costs, held, share)
                   if o.risky else o for o in usable]
        if any(o is None for o in guarded):
            notes.append("risky options without room for their worst case before the "
                         + ("regret cap or " if goal.cap_usd is not None else "")
                         + "deadline set aside")
        usable = [o for o in guarded if o is not None] or [safe]
    late: Option | None = None  # the fastest safe option, when risky ones are tried
    if goal.deadline_s is not None:
        margin = 1 + policy.deadline_margin
        fallback = safe or min((fresh[o.key] for o in usable), key=lambda o: o.expected_s)
        in_time = [o for o in usable if o.expected_s * margin <= goal.deadline_s]
        tryable = [o for o in usable if o in in_time or o.risky and safe is not None or
                   time_in_hand_s(goal, fallback.expected_s, policy, o.reserve_s) > 0]
        if tryable:
            usable = tryable
            late = fallback
        else:
            notes.append(f"nothing finishes {policy.deadline_margin:.0%} before the deadline "
                         f"({goal.deadline_s / 3600:.1f} h left) with room for the worst case; "
                         "the fastest")
            usable = [min(usable, key=lambda o: o.expected_s)]
    if policy.objective == "time":
        best = min(usable, key=lambda o: (o.expected_s, o.expected_cost_usd))
    else:
        best = min(usable, key=lambda o: (_tried_cost(o, late, goal, policy), o.expected_s))
    if late is not None and goal.deadline_s is not None and \
            best.expected_s * (1 + policy.deadline_margin) > goal.deadline_s:
        notes.append(f"expected past the deadline, with time in hand to fall back to "
                     f"{late.describe()} ({late.expected_hours:.2f} h) after the worst case")
    return Decision("start", best, _account(best, policy, notes, costs))


MIN_INTERVAL_CHECKPOINTS = 4.0  # a guard may shorten the interval down to this many C


def _within_guards(option: Option, safe: Option, goal: Goal, policy: PolicySpec,
                   observed: Observed, costs: Costs | None,
                   held: tuple[str, str, int] | None, share: float) -> Option | None:
    """A risky option as it may be held with room for its worst case before both the regret
    cap and the deadline (with `share` of the room: a half to come back from safe capacity):
    as it is, with a shorter checkpoint interval (a smaller worst case, for more
    checkpoints), or None when no interval leaves room."""
    room_s = math.inf
    if goal.cap_usd is not None:
        room_s = (goal.cap_usd - safe.expected_cost_usd) * 3600 / option.usd_per_hour
    if goal.deadline_s is not None:
        room_s = min(room_s, time_in_hand_s(goal, safe.expected_s, policy))
    room_s *= share
    if option.reserve_s <= room_s:
        return option
    costs = costs or policy_costs(policy)
    fixed_s = option.reserve_s - (option.checkpoint_interval_s or 0.0)
    interval = room_s - fixed_s
    if option.checkpoint_interval_s is None or \
            interval < MIN_INTERVAL_CHECKPOINTS * max(costs.checkpoint_s, 1.0):
        return None
    return evaluate_option(option.offer, option.market, option.nodes, option.tokens_per_s,
                           option.layout, goal, policy, observed, costs,
                           held == option.key, max_interval_s=interval, groups=option.groups)


def _tried_cost(option: Option, fallback: Option | None, goal: Goal,
                policy: PolicySpec) -> float:
    """An option's expected cost to finish; for one expected to finish late, tried while
    `fallback` (the fastest) still has time in hand, the cost of the share of the work it
    does before that time is gone plus the rest on the fallback."""
    margin = 1 + policy.deadline_margin
    if fallback is None or goal.deadline_s is None or \
            option.expected_s * margin <= goal.deadline_s:
        return option.expected_cost_usd
    room = time_in_hand_s(goal, fallback.expected_s, policy, option.reserve_s)
    share = min(1.0, max(0.0, room / max(option.expected_s - fallback.expected_s * margin,
                                         1e-9)))
    return share * option.expected_cost_usd + (1 - share) * fallback.expected_cost_usd


def _account(best: Option, policy: PolicySpec, notes: list[str],
             costs: Costs | None) -> str:
    text = (f"{best.describe()}: expected {best.expected_hours:.2f} h, "
            f"${best.expected_cost_usd:,.2f} to finish")
    if best.market == "spot":
        text += (f", {best.preemptions_per_hour:.3g} preemptions/h, checkpoint every "
                 f"{best.checkpoint_interval_s or 0:.0f} s")
    text += f"; by {policy.objective} ({policy.name})"
    text += f"; {(costs or policy_costs(policy)).describe(best.offer.id, best.market)}"
    return text + ("; " + "; ".join(notes) if notes else "")


def redecide(current: Option, event: str, goal: Goal, offers: list[Offer],
             throughput: Throughput, policy: PolicySpec, observed: Observed,
             costs: Costs | None = None) -> Decision:
    """Re-decide a running (or preempted) job on an event: 'preemption', 'capacity-missing',
    'progress' (checks the deadline and the regret cap) or 'prices'. Stays unless moving pays
    or is forced.

        redecide(option, "progress", goal, offers, throughput, policy, observed)
    """
    stopped = event in ("preemption", "capacity-missing")
    held = None if stopped else current.key
    best = choose(goal, offers, throughput, policy, observed, costs, held)
    if best.option is None:
        return Decision("wait", None, best.reason)
    offer = next((o for o in offers if o.id == current.offer.id
                  and o.usd_per_hour(current.market) is not None), current.offer)
    now = evaluate_option(offer, current.market, current.nodes, current.tokens_per_s,
                          current.layout, goal, policy, observed, costs, held=not stopped,
                          groups=current.groups)
    if best.option.key == now.key:  # as the guards may have it: checkpointing sooner
        return Decision("stay", best.option, f"still the best: {best.reason}")
    if stopped or (current.offer.id, current.market) in observed.unavailable or \
            current.market not in _markets_now(policy, observed):
        # The job is stopped anyway (or must leave): moving costs nothing extra.
        return Decision("switch", best.option, f"{event}: {best.reason}")
    if now.risky and not best.option.risky and _within_guards(
            now, best.option, goal, policy, observed, costs, now.key, 1.0) is None:
        return Decision("switch", best.option, f"behind the deadline or the regret cap on "
                        f"{now.describe()} (expected {now.expected_hours:.2f} h"
                        + (f" of {goal.deadline_s / 3600:.2f} h left" if goal.deadline_s
                           else "") + f"): {best.reason}", at_checkpoint=True)
    saving = now.expected_cost_usd - best.option.expected_cost_usd
    if saving > policy.switch_min_saving * now.expected_cost_usd and saving > 0:
        return Decision("switch", best.option, f"saves ${saving:,.2f} of "
                        f"${now.expected_cost_usd:,.2f}, the move included: {best.reason}",
                        at_checkpoint=True)
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
