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
from functools import lru_cache
from typing import Callable, Iterable, Mapping

from raytrain.catalog.hardware import GPUS
from raytrain.catalog.shapes import shape_from_key, shape_key, usd_for
from raytrain.core.planner import ModelDims, Workload, evaluate, fastest
from raytrain.core.resolve import planner_inputs
from raytrain.spec import JobSpec, Offer, PolicySpec

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


def evaluate_option(offer: Offer, market: str, nodes: int, tokens_per_s: float, layout: str,
                    goal: Goal, policy: PolicySpec, observed: Observed) -> Option:
    price = offer.usd_per_hour(market)
    assert price is not None, f"{offer.id} has no {market} price"
    rate_per_hour = nodes * observed.rate(offer, policy.prior_node_hours) if market == "spot" \
        else 0.0
    rate_per_s = rate_per_hour / 3600
    restart_s = policy.restart_s if rate_per_s else 0.0
    interval = policy.checkpoint_interval_s or optimal_interval_s(
        policy.checkpoint_cost_s, rate_per_s, restart_s, policy.notice_coverage)
    if rate_per_s == 0:
        interval = policy.checkpoint_interval_s  # no risk: the job's own schedule
    elif interval is not None:
        interval = min(interval, policy.max_checkpoint_interval_s)
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
    if goal.deadline_s is not None:
        in_time = [o for o in usable if o.expected_s * (1 + policy.deadline_margin)
                   <= goal.deadline_s]
        if in_time:
            usable = in_time
        else:
            notes.append(f"nothing finishes {policy.deadline_margin:.0%} before the deadline "
                         f"({goal.deadline_s / 3600:.1f} h left); the fastest")
            usable = [min(usable, key=lambda o: o.expected_s)]
    if policy.objective == "time":
        best = min(usable, key=lambda o: (o.expected_s, o.expected_cost_usd))
    else:
        best = min(usable, key=lambda o: (o.expected_cost_usd, o.expected_s))
    return Decision("start", best, _account(best, policy, notes))


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
            best.option.expected_s < now.expected_s:
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


def planner_throughput(dims: ModelDims, work: Workload) -> Throughput:
    """The planner's best throughput for the job on `nodes` of an offer, memoised per node
    shape and count (offers that differ only in price share one search)."""

    @lru_cache(maxsize=None)
    def best(key: tuple[str, int, str, float, bool], nodes: int) -> tuple[float, str] | None:
        top = fastest(dims, work, nodes * key[1], shape_from_key(key))
        return None if top is None else (top.tokens_per_s, top.candidate.describe())

    return lambda offer, nodes: best(shape_key(offer), nodes)


def flops_throughput(tokens_per_s_per_pflops: float) -> Throughput:
    """For a model whose dimensions are unknown: throughput proportional to the offer's
    achievable dense FLOP/s, at a rate per PFLOP/s the caller states."""

    def throughput(offer: Offer, nodes: int) -> tuple[float, str] | None:
        gpu = GPUS[offer.gpu_kind]
        pflops = gpu.bf16_flops * gpu.achievable * nodes * offer.gpus_per_node / 1e15
        return tokens_per_s_per_pflops * pflops, f"dp{nodes * offer.gpus_per_node} (assumed)"

    return throughput


def with_history(observed: Observed, offer_id: str, preempted: int, node_hours: float
                 ) -> Observed:
    """`observed` plus `node_hours` of spot on an offer, `preempted` times."""
    count, hours = observed.spot_history.get(offer_id, (0, 0.0))
    history = dict(observed.spot_history)
    history[offer_id] = (count + preempted, hours + node_hours)
    return replace(observed, spot_history=history, preemptions=observed.preemptions + preempted)


def fixed_devices(throughput: Throughput, devices: int) -> Throughput:
    """Only node counts that give exactly `devices` devices (a job whose layout is fixed)."""
    return lambda offer, nodes: (throughput(offer, nodes)
                                 if nodes * offer.gpus_per_node == devices else None)


def offer_matches(spec: JobSpec, offer: Offer) -> bool:
    """Whether an offer's nodes have the devices the job asks for: CPU nodes for a CPU job
    (gpus_per_worker 0), GPU nodes of the job's accelerator (any GPU kind if it names none)
    for a GPU job. Predictions are then for the devices the job would run on."""
    if not spec.resources.use_gpu:
        return offer.gpu_kind == "cpu"
    wanted = spec.resources.accelerator
    return offer.gpu_kind != "cpu" and (wanted is None or offer.gpu_kind == wanted)


def device_mismatch(spec: JobSpec, offers: Iterable[Offer]) -> str | None:
    """Why no offer can hold the job's devices, with the fix; None if some offer can."""
    offers = list(offers)
    if any(offer_matches(spec, o) for o in offers):
        return None
    kinds = sorted({o.gpu_kind for o in offers}) or ["none"]
    if not spec.resources.use_gpu:
        return ("no offer has CPU-only nodes, and the job asks for CPU workers "
                "(resources.gpus_per_worker 0). To fix: set resources.gpus_per_worker and "
                f"resources.accelerator (offers have: {', '.join(kinds)})")
    gpus = [k for k in kinds if k not in ("cpu", "none")]
    if not gpus:
        return ("no offer has GPU nodes, and the job asks for GPUs (resources.gpus_per_worker "
                f"{spec.resources.gpus_per_worker:g}). To fix: set resources.gpus_per_worker 0 "
                "to train on CPU nodes, or use a service that buys GPU nodes")
    wanted = spec.resources.accelerator or "GPU"
    return (f"no offer has {wanted} nodes. To fix: set resources.accelerator to one of "
            f"{', '.join(gpus)}")


def job_throughput(spec: JobSpec) -> Throughput:
    """The planner's throughput for a job on an offer whose devices match it
    (`offer_matches`): its best layout for any device count under strategy 'auto', else the
    job's own layout on exactly its number of workers. A model of unknown size is assumed to
    run at 1e3 tokens/s per achievable PFLOP/s (each option's layout says 'assumed')."""
    inner = _planned_throughput(spec)
    return lambda offer, nodes: inner(offer, nodes) if offer_matches(spec, offer) else None


def _planned_throughput(spec: JobSpec) -> Throughput:
    if spec.model.kind != "gpt":
        return fixed_devices(flops_throughput(1e3), spec.resources.num_workers)
    dims, work, _, _ = planner_inputs(spec)
    own = spec.stated_layout()
    if own is None:  # strategy 'auto': the best layout for each option's devices
        return planner_throughput(dims, replace(work, micro_batch_options=(1, 2, 4, 8, 16)))

    @lru_cache(maxsize=None)
    def on_shape(key: tuple[str, int, str, float, bool]) -> tuple[float, str] | None:
        predicted = evaluate(dims, work, own, shape_from_key(key))
        return (predicted.tokens_per_s, own.describe()) if predicted.fits else None

    return fixed_devices(lambda offer, nodes: on_shape(shape_key(offer)),
                         spec.resources.num_workers)


def job_goal(spec: JobSpec, steps_done: int = 0, elapsed_s: float = 0.0,
             spent_usd: float = 0.0) -> Goal:
    """What is left of a job after `steps_done` steps, `elapsed_s` since submission and
    `spent_usd` spent."""
    capacity = spec.capacity
    deadline = None if capacity.deadline_hours is None else \
        max(1.0, capacity.deadline_hours * 3600 - elapsed_s)
    budget = None if capacity.budget_usd is None else max(0.0, capacity.budget_usd - spent_usd)
    markets = ("spot", "on-demand") if capacity.market == "auto" else (capacity.market,)
    tokens = max(1, spec.training.steps - steps_done) * spec.tokens_per_step
    return Goal(tokens, deadline, budget, capacity.max_usd_per_hour, markets)
