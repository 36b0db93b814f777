"""Trace-driven simulation of one job on a spot fleet: cost, completion time, deadline and work
lost under the ways of buying capacity below, on the same recorded preemptions.

A trace is the life of a real spot fleet: when each node came and when it was taken away. The
job needs `nodes` of them at once (a fixed-size worker group). Spot nodes it holds are billed
while held; a held node that the trace removes is a preemption: the job loses the work since
its last checkpoint (none when the notice let it checkpoint first), keeps its other nodes,
waits for a replacement and restarts. On-demand capacity is always there, at its price.

Strategies:
- `on-demand`: on-demand from the start.
- `spot`: spot only, restarting from a checkpoint taken every `fixed_interval_s`.
- `failover`: as `spot` until the first preemption, then on-demand.
- `policy`: the live service's capacity engine (raytrain.core.engine) fed the trace's events:
  at the start, on every preemption, when spot capacity stays missing, and every `recheck_s`
  (deadline); its checkpoint interval is Young's for the preemption rate it has seen.
- `uniform-progress`: Can't Be Late's rule (Wu et al., NSDI'24), the published one to beat.
  The expected progress at t is work x t / deadline. Idle (no capacity) and behind it: on
  demand. Spot whenever it is there, kept until preempted. On demand is left (at a
  checkpoint) only once progress is ahead of the expectation at t + 2 restarts. Safety net:
  idle with less time left than the work plus 2 restarts: on demand to the end. It
  checkpoints at the policy's interval for the rate it has seen, so only the buying differs.
- `oracle`: the hindsight-optimal schedule (raytrain.core.hindsight), a lower bound.

Pure: the trace is a list of values and time is simulated; the files are read by
raytrain.catalog.traces.

    result = simulate(trace, job, "policy", policy, start_s=0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from raytrain.catalog.shapes import usd_for
from raytrain.core.autoscale import Goal, Option, checkpoint_interval_s
from raytrain.core.engine import CapacityEngine
from raytrain.core.fleet import Fleet, SimJob, SimResult, Trace, TraceEvent, replay
from raytrain.core.hindsight import hindsight
from raytrain.spec import Offer, PolicySpec

STRATEGIES = ("on-demand", "spot", "failover", "uniform-progress", "policy", "oracle")


@dataclass
class _State:
    market: str
    held: set[str] = field(default_factory=set)
    done_s: float = 0.0
    saved_s: float = 0.0  # work in the latest checkpoint
    since_checkpoint_s: float = 0.0
    checkpointing_left_s: float = 0.0
    restart_left_s: float = 0.0
    waiting_since: float | None = None
    pending_switch: Option | None = None
    pending_market: str | None = None  # uniform-progress: leave on-demand at the checkpoint
    on_demand_to_the_end: bool = False  # uniform-progress's safety net
    interval_s: float = 3600.0


def simulate(trace: Trace, job: SimJob, strategy: str, policy: PolicySpec,
             start_s: float = 0.0, on_demand_from_s: float | None = None) -> SimResult:
    """Run the job from `start_s` into the trace until it finishes (or 20x its work). The
    policy and the oracle may also choose the job's alternative fleets; the other strategies
    run on its own. `on_demand_from_s` (uniform-progress only) moves the job to on-demand to
    the end at that time if it is still on spot: a late run repaired with hindsight."""
    fleets = [Fleet(job.offer, job.nodes, trace)]
    if strategy in ("policy", "oracle"):
        fleets += job.alternatives
    if strategy == "oracle":  # with alternatives: the best schedule that keeps to one fleet
        return min((hindsight(f.trace, replace(job, offer=f.offer, nodes=f.nodes,
                                               work_s=job.work_s / f.speed), start_s)
                    for f in fleets), key=lambda r: (not r.met_deadline, r.cost_usd))
    horizon = job.horizon_s
    events = sorted((TraceEvent(e.time_s, e.kind, f"{i}/{e.node}") for i, f in enumerate(fleets)
                     for e in replay(f.trace, start_s, horizon)), key=lambda e: e.time_s)
    offers = list({f.offer.id: f.offer for f in fleets}.values())
    fleet, offer, n, speed = 0, job.offer, job.nodes, 1.0
    spot_usd, od_usd = offer.usd_per_hour("spot") or math.inf, offer.usd_per_hour("on-demand")
    assert all(f.offer.usd_per_hour("on-demand") for f in fleets), \
        "the simulated offers need an on-demand price"

    def throughput(option_offer: Offer, nodes: int) -> tuple[float, str] | None:
        for f in fleets:
            if f.offer.id == option_offer.id and f.nodes == nodes:
                return f.speed, f"{nodes} nodes"
        return None

    policy = replace_policy(policy, job)
    engine = CapacityEngine(policy, offers, throughput)  # the live service's, fed the trace

    def goal(now: float, state: _State) -> Goal:
        left = job.work_s - state.done_s
        deadline = None if job.deadline_s is None else max(1.0, job.deadline_s - now)
        return Goal(tokens_left=max(left, 1.0), deadline_s=deadline)

    result = SimResult(strategy, trace.name, start_s, math.inf, 0.0, 0, 0.0, 0.0, False)
    first = "on-demand" if strategy == "on-demand" else "spot"
    state = _State(market=first, interval_s=job.fixed_interval_s)
    current: Option | None = None
    if strategy == "policy":
        decision = engine.on("submit", goal(0.0, state))
        assert decision.option is not None, decision.reason
        current = decision.option
        state.market = current.market
        state.interval_s = current.checkpoint_interval_s or job.fixed_interval_s
        result.decisions.append(f"0 h: {decision.reason}")
    alive: list[set[str]] = [set() for _ in fleets]
    index, now, next_recheck = 0, 0.0, job.recheck_s
    state.restart_left_s = job.restart_s if state.market == "on-demand" else 0.0
    state.waiting_since = 0.0 if state.market == "spot" else None

    def move(market: str, to: int | None = None) -> None:
        nonlocal fleet, offer, n, speed, spot_usd, od_usd
        to = fleet if to is None else to
        if market != state.market or to != fleet:
            fleet, offer, n, speed = to, fleets[to].offer, fleets[to].nodes, fleets[to].speed
            spot_usd = offer.usd_per_hour("spot") or math.inf
            od_usd = offer.usd_per_hour("on-demand")
            state.market = market
            state.held.clear()
            state.since_checkpoint_s = 0.0
            state.done_s = state.saved_s
            state.restart_left_s = job.restart_s if market == "on-demand" else 0.0
            state.waiting_since = now if market == "spot" else None

    def fleet_of(option: Option) -> int:
        return next(i for i, f in enumerate(fleets)
                    if (f.offer.id, f.nodes) == (option.offer.id, option.nodes))

    def adopt(option: Option, why: str) -> None:
        nonlocal current
        current = option
        move(option.market, fleet_of(option))
        state.interval_s = option.checkpoint_interval_s or job.fixed_interval_s
        result.decisions.append(f"{now / 3600:.2f} h: {why}")

    def checkpoint_for_a_move() -> bool:
        """Start the checkpoint a move waits for, now, as the live service does; False when
        nothing is unsaved (waiting, restarting), so the move can happen at once."""
        if state.done_s == state.saved_s:
            return False
        if state.checkpointing_left_s <= 0:
            state.since_checkpoint_s, state.checkpointing_left_s = 0.0, job.checkpoint_cost_s
        return True

    def young_interval() -> float:
        """uniform-progress's interval: the policy's, for the rate seen so far."""
        rate = n * engine.observed.rate(offer, policy.prior_node_hours) / 3600
        return checkpoint_interval_s(policy, rate) or job.fixed_interval_s

    if strategy == "uniform-progress":
        state.interval_s = young_interval()
    if current is not None:  # the policy's first choice may be another fleet
        move(current.market, fleet_of(current))

    while now < horizon and state.done_s < job.work_s:
        # Trace events up to now.
        while index < len(events) and events[index].time_s <= now:
            event = events[index]
            index += 1
            at = int(event.node.split("/", 1)[0])
            if event.kind == "add":
                alive[at].add(event.node)
                continue
            alive[at].discard(event.node)
            if state.market != "spot" or event.node not in state.held:
                continue
            # A preemption of a node the job holds.
            result.preemptions += 1
            if state.checkpointing_left_s <= 0 and state.restart_left_s <= 0 and \
                    state.waiting_since is None and job.notice_s >= job.checkpoint_cost_s:
                state.saved_s = state.done_s  # checkpointed on the notice
            result.lost_work_s += state.done_s - state.saved_s
            state.done_s = state.saved_s
            state.since_checkpoint_s = 0.0
            state.checkpointing_left_s = 0.0
            state.held.discard(event.node)
            state.waiting_since = now
            state.restart_left_s = 0.0
            state.pending_switch = None  # the checkpoint it waited for is lost; decide again
            if strategy == "failover":
                state.market, state.held = "on-demand", set()
                state.restart_left_s, state.waiting_since = job.restart_s, None
            elif strategy == "uniform-progress":
                engine.exposed(offer.id, preempted=1)
                state.interval_s = young_interval()
            elif strategy == "policy" and current is not None:
                engine.exposed(offer.id, preempted=1)
                decision = engine.on("preemption", goal(now, state))
                if decision.option is not None:
                    adopt(decision.option, f"preemption: {decision.action} "
                                           f"{decision.option.describe()}")
        # Acquire spot capacity.
        if state.market == "spot" and state.waiting_since is not None:
            free = sorted(alive[fleet] - state.held)
            state.held.update(free[: n - len(state.held)])
            if len(state.held) == n:
                state.waiting_since = None
                state.restart_left_s = job.restart_s
            elif strategy == "policy" and current is not None and \
                    now - state.waiting_since >= policy.capacity_wait_s:
                decision = engine.on("capacity-missing", goal(now, state))
                if decision.option is not None:
                    adopt(decision.option, f"spot missing {policy.capacity_wait_s:.0f} s: "
                                           f"{decision.option.describe()}")
        if strategy == "uniform-progress":
            forced = on_demand_from_s is not None and now >= on_demand_from_s and \
                state.market == "spot"
            state.on_demand_to_the_end = state.on_demand_to_the_end or forced
            market = "on-demand" if forced else uniform_progress(state, job, now)
            if market is not None:
                result.decisions.append(f"{now / 3600:.2f} h: {market}")
                if market == "on-demand" or not checkpoint_for_a_move():
                    move(market)
                    state.on_demand_to_the_end = state.on_demand_to_the_end or \
                        _out_of_slack(job, now, state.saved_s)
                else:
                    state.pending_market = market  # leave at the checkpoint taken now
        # Re-decide on progress (deadline, and spot coming back after a capacity gap).
        if strategy == "policy" and current is not None and now >= next_recheck:
            next_recheck = now + job.recheck_s
            back = {(f.offer.id, "spot") for i, f in enumerate(fleets)
                    if len(alive[i]) >= f.nodes and (i != fleet or state.market != "spot")}
            engine.capacity_back(back)  # spot capacity is there again
            decision = engine.on("progress", goal(now, state))
            if decision.action == "switch" and decision.option is not None:
                result.decisions.append(f"{now / 3600:.2f} h: {decision.reason}")
                if checkpoint_for_a_move():
                    state.pending_switch = decision.option
                else:
                    adopt(decision.option, "switched (nothing unsaved)")
        # Advance one step.
        dt = job.step_s
        holding = n if state.market == "on-demand" else len(state.held)
        price = od_usd if state.market == "on-demand" else spot_usd
        bill = usd_for(price, dt, holding)
        result.cost_usd += bill
        phase = "waiting" if state.waiting_since is not None else "restarting" \
            if state.restart_left_s > 0 else "checkpointing" if state.checkpointing_left_s > 0 \
            else "training"
        result.cost_by_phase[phase] = result.cost_by_phase.get(phase, 0.0) + bill
        if state.market == "spot":
            engine.exposed(offer.id, node_hours=holding * dt / 3600)
        else:
            result.on_demand_s += dt
        if state.waiting_since is None:
            if state.restart_left_s > 0:
                state.restart_left_s -= dt
            elif state.checkpointing_left_s > 0:
                state.checkpointing_left_s -= dt
                if state.checkpointing_left_s <= 0:
                    state.saved_s = state.done_s
                    if state.pending_switch is not None:
                        switch, state.pending_switch = state.pending_switch, None
                        adopt(switch, f"switched at the checkpoint to {switch.describe()}")
                    elif state.pending_market is not None:
                        move(state.pending_market)
                        state.pending_market = None
            else:
                state.done_s += dt * speed
                state.since_checkpoint_s += dt
                if state.since_checkpoint_s >= state.interval_s and state.done_s < job.work_s:
                    state.since_checkpoint_s = 0.0
                    state.checkpointing_left_s = job.checkpoint_cost_s
        now += dt
    result.finished_s = now if state.done_s >= job.work_s else math.inf
    result.met_deadline = job.deadline_s is None or result.finished_s <= job.deadline_s
    return result


def uniform_progress(state: _State, job: SimJob, now: float) -> str | None:
    """The market Can't Be Late's Uniform Progress moves to now, or None to stay (module
    doc). Progress counts what a checkpoint holds, plus the unsaved work while running."""
    if job.deadline_s is None or state.pending_market is not None:
        return None

    def expected(t: float) -> float:
        return job.work_s * min(t, job.deadline_s) / job.deadline_s

    if state.market == "on-demand":
        ahead = state.done_s >= expected(now + 2 * job.restart_s)
        return "spot" if ahead and not state.on_demand_to_the_end else None
    if state.waiting_since is None:
        return None  # on spot: kept until preempted
    if _out_of_slack(job, now, state.saved_s) or state.saved_s < expected(now):
        return "on-demand"
    return None


def _out_of_slack(job: SimJob, now: float, done_s: float) -> bool:
    """Uniform Progress's safety net: less time left than the work plus two restarts."""
    return job.deadline_s is not None and \
        job.deadline_s - now < job.work_s - done_s + 2 * job.restart_s


def replace_policy(policy: PolicySpec, job: SimJob) -> PolicySpec:
    """The policy told the job's real checkpoint and restart costs, and whether notices
    arrive in time to checkpoint on them."""
    coverage = 1.0 if job.notice_s >= job.checkpoint_cost_s else 0.0
    return policy.model_copy(update={"checkpoint_cost_s": job.checkpoint_cost_s,
                                     "restart_s": job.restart_s, "notice_coverage": coverage})


@dataclass(frozen=True)
class Summary:
    """One strategy on one trace, over several start times."""

    trace: str
    notice_s: float
    strategy: str
    runs: int
    mean_cost_usd: float
    mean_hours: float  # to finish (runs that never finish count at the horizon)
    deadline_misses: int
    mean_preemptions: float
    mean_lost_work_hours: float
    mean_on_demand_hours: float


def compare(trace: Trace, job: SimJob, policy: PolicySpec, starts: int,
            strategies: tuple[str, ...] = STRATEGIES) -> list[Summary]:
    """Every strategy from `starts` start times spread evenly over the trace.

        for row in compare(trace, job, policy, starts=11): print(row)
    """
    times = [trace.duration_s * i / starts for i in range(starts)]
    rows = []
    for strategy in strategies:
        results = [simulate(trace, job, strategy, policy, t) for t in times]
        horizon = job.horizon_s
        rows.append(Summary(
            trace.name, job.notice_s, strategy, len(results),
            sum(r.cost_usd for r in results) / len(results),
            sum(min(r.finished_s, horizon) for r in results) / len(results) / 3600,
            sum(not r.met_deadline for r in results),
            sum(r.preemptions for r in results) / len(results),
            sum(r.lost_work_s for r in results) / len(results) / 3600,
            sum(r.on_demand_s for r in results) / len(results) / 3600,
        ))
    return rows


def as_runs(rows: list[Summary]) -> dict[str, list[dict[str, object]]]:
    """Summaries grouped by trace and notice, each strategy's figures by name, with its saving
    against on-demand (a fraction of on-demand's mean cost): `raytrain simulate --json`.

        {"runs": [{"trace": "p3-trace", "notice_s": 0.0, "strategies": {"policy": {...}}}]}
    """
    runs: dict[tuple[str, float], dict[str, dict[str, object]]] = {}
    for row in rows:
        figures = {k: v for k, v in asdict(row).items()
                   if k not in ("trace", "notice_s", "strategy")}
        runs.setdefault((row.trace, row.notice_s), {})[row.strategy] = figures
    for strategies in runs.values():
        on_demand = strategies.get("on-demand", {}).get("mean_cost_usd")
        for figures in strategies.values():
            figures["saving_vs_on_demand"] = None if not on_demand else \
                round(1.0 - float(figures["mean_cost_usd"]) / float(on_demand), 4)
    return {"runs": [{"trace": trace, "notice_s": notice, "strategies": strategies}
                     for (trace, notice), strategies in runs.items()]}
