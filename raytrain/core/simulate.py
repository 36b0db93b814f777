"""What the simulator reports, and the one strategy it computes outside the live service.

The strategies that are policies of the service (the policy itself, on-demand, spot with a
fixed interval, failover) are replayed through the live service (raytrain.sim.replay), and
the hindsight-optimal schedule is raytrain.core.hindsight. Here:

- `uniform_progress`: Can't Be Late's Uniform Progress rule (Wu et al., NSDI'24), the
  published one to beat; not a policy of the service, so simulated here, on the same trace
  replay and under the same cloud figures and bill (each node from up to gone: on-demand
  nodes and new spot nodes from `ready_s` after they are taken, spot nodes while held,
  waiting included).
  The expected progress at t is work x t / deadline. Idle (no capacity) and behind it: on
  demand. Spot whenever it is there, kept until preempted. On demand is left (at a
  checkpoint) only for spot that is there, once progress is ahead of the expectation at
  t + 2 restarts. Safety net:
  idle with less time left than the work plus 2 restarts: on demand to the end. It
  checkpoints at the policy's interval for the rate it has seen, so only the buying differs.
- `Summary` and `as_runs`: each strategy's figures over the start times of a trace, its
  regret (cost over on-demand's from the same start) and its deadline misses.

Pure: the trace is a list of values and time is simulated; the files are read by
raytrain.catalog.traces.

    result = uniform_progress(trace, job, policy, start_s=0)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, cast

from raytrain.catalog.prices import usd_for
from raytrain.catalog.spot_trace import TraceEvent
from raytrain.core.autoscale import Observed, with_history
from raytrain.core.costs import Costs
from raytrain.core.fleet import SimJob, SimResult, Trace, notice_given, replay
from raytrain.core.interval import checkpoint_interval_s
from raytrain.spec import PolicySpec

STRATEGIES = ("on-demand", "spot", "failover", "uniform-progress", "policy-rigid", "policy",
              "oracle")


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
    booting: int = 0  # nodes taken that are not up yet (not billed)
    pending_market: str | None = None  # leave on-demand at the checkpoint
    on_demand_to_the_end: bool = False  # the safety net
    interval_s: float = 3600.0


def uniform_progress(trace: Trace, job: SimJob, policy: PolicySpec, start_s: float = 0.0,
                     on_demand_from_s: float | None = None) -> SimResult:
    """Run the job from `start_s` into the trace under Uniform Progress until it finishes (or
    its horizon). `on_demand_from_s` moves it to on-demand to the end at that time if it is
    still on spot: a late run repaired with hindsight."""
    horizon = job.horizon_s
    events = replay(trace, start_s, horizon)
    offer, n = job.offer, job.nodes
    spot_usd, od_usd = offer.usd_per_hour("spot") or math.inf, offer.usd_per_hour("on-demand")
    assert od_usd, "the simulated offer needs an on-demand price"
    costs = Costs(job.checkpoint_cost_s, job.checkpoint_cost_s, job.restart_s, job.ready_s)
    observed = Observed()
    result = SimResult("uniform-progress", trace.name, start_s, math.inf, 0.0, 0, 0.0, 0.0,
                       False)
    state = _State(market="spot", waiting_since=0.0)
    alive: set[str] = set()
    index, now = 0, 0.0

    def young_interval() -> float:
        rate = n * observed.rate(offer, policy.prior_node_hours) / 3600
        return checkpoint_interval_s(policy, rate, costs, offer) or job.fixed_interval_s

    def move(market: str) -> None:
        if market != state.market:
            state.market = market
            state.held.clear()
            state.since_checkpoint_s = 0.0
            state.done_s = state.saved_s
            state.restart_left_s = job.ready_s + job.restart_s if market == "on-demand" else 0
            state.waiting_since = now if market == "spot" else None

    def checkpoint_for_a_move() -> bool:
        if state.done_s == state.saved_s:
            return False
        if state.checkpointing_left_s <= 0:
            state.since_checkpoint_s, state.checkpointing_left_s = 0.0, job.checkpoint_cost_s
        return True

    state.interval_s = young_interval()
    while now < horizon and state.done_s < job.work_s:
        while index < len(events) and events[index].time_s <= now:
            index += 1
            if _node_event(events[index - 1], now, alive, state, job, result):
                observed = with_history(observed, offer.id, 1, 0.0)
                state.interval_s = young_interval()
        if state.market == "spot" and state.waiting_since is not None:
            free = sorted(alive - state.held)[: n - len(state.held)]
            state.held.update(free)
            state.booting += len(free)
            if len(state.held) == n:  # the new nodes come up, then the group starts
                state.waiting_since = None
                state.restart_left_s = job.ready_s + job.restart_s
        forced = on_demand_from_s is not None and now >= on_demand_from_s and \
            state.market == "spot"
        state.on_demand_to_the_end = state.on_demand_to_the_end or forced
        market = "on-demand" if forced else uniform_progress_move(state, job, now,
                                                                  len(alive) >= n)
        if market is not None:
            result.decisions.append(f"{now / 3600:.2f} h: {market}")
            if market == "on-demand" or not checkpoint_for_a_move():
                move(market)
                state.on_demand_to_the_end = state.on_demand_to_the_end or \
                    _out_of_slack(job, now, state.saved_s)
            else:
                state.pending_market = market  # leave at the checkpoint taken now
        observed = _advance(state, job, result, observed, (spot_usd, od_usd), n, offer.id,
                            move)
        now += job.step_s
    result.finished_s = now if state.done_s >= job.work_s else math.inf
    result.met_deadline = job.deadline_s is None or result.finished_s <= job.deadline_s
    return result


def _node_event(event: TraceEvent, now: float, alive: set[str], state: _State, job: SimJob,
                result: SimResult) -> bool:
    """Apply one trace event to the run; True when it took a node the run held (a
    preemption: the work since the last checkpoint is lost unless a notice saved it)."""
    if event.kind == "add":
        alive.add(event.node)
        return False
    alive.discard(event.node)
    if state.market != "spot" or event.node not in state.held:
        return False
    result.preemptions += 1
    noticed = job.notice_s >= job.checkpoint_cost_s and notice_given(
        event.node, event.time_s, job.notice_share)
    if noticed and state.checkpointing_left_s <= 0 and state.restart_left_s <= 0 \
            and state.waiting_since is None:
        state.saved_s = state.done_s  # checkpointed on the notice
    result.lost_work_s += state.done_s - state.saved_s
    state.done_s = state.saved_s
    state.since_checkpoint_s = state.checkpointing_left_s = 0.0
    state.held.discard(event.node)
    state.waiting_since, state.restart_left_s = now, 0.0
    return True


def _advance(state: _State, job: SimJob, result: SimResult, observed: Observed,
             prices: tuple[float, float], n: int, offer_id: str,
             move: Callable[[str], None]) -> Observed:
    """One step of job.step_s: bill what is up, then restart, checkpoint or train."""
    spot_usd, od_usd = prices
    dt = job.step_s
    if state.market == "on-demand":
        booting = max(0.0, state.restart_left_s - job.restart_s)  # not up yet
        bill = usd_for(od_usd, max(0.0, dt - booting), n)
        result.on_demand_s += dt
    else:
        booting = state.booting if state.restart_left_s > job.restart_s else 0
        state.booting = booting
        bill = usd_for(spot_usd, dt, len(state.held) - booting)
        observed = with_history(observed, offer_id, 0, len(state.held) * dt / 3600)
    result.cost_usd += bill
    if state.waiting_since is None:
        if state.restart_left_s > 0:
            state.restart_left_s -= dt
        elif state.checkpointing_left_s > 0:
            state.checkpointing_left_s -= dt
            if state.checkpointing_left_s <= 0:
                state.saved_s = state.done_s
                if state.pending_market is not None:
                    move(state.pending_market)
                    state.pending_market = None
        else:
            state.done_s += dt
            state.since_checkpoint_s += dt
            if state.since_checkpoint_s >= state.interval_s and state.done_s < job.work_s:
                state.since_checkpoint_s = 0.0
                state.checkpointing_left_s = job.checkpoint_cost_s
    return observed


def uniform_progress_move(state: _State, job: SimJob, now: float,
                          spot_there: bool = True) -> str | None:
    """The market Uniform Progress moves to now, or None to stay (module doc). Progress
    counts what a checkpoint holds, plus the unsaved work while running. It leaves on-demand
    only for spot that is there (`spot_there`), as the paper's rule does."""
    deadline = job.deadline_s
    if deadline is None or state.pending_market is not None:
        return None

    def expected(t: float) -> float:
        return job.work_s * min(t, deadline) / deadline

    restart = job.ready_s + job.restart_s
    if state.market == "on-demand":
        ahead = state.done_s >= expected(now + 2 * restart)
        return "spot" if ahead and spot_there and not state.on_demand_to_the_end else None
    if state.waiting_since is None:
        return None  # on spot: kept until preempted
    if _out_of_slack(job, now, state.saved_s) or state.saved_s < expected(now):
        return "on-demand"
    return None


def _out_of_slack(job: SimJob, now: float, done_s: float) -> bool:
    """Uniform Progress's safety net: less time left than the work plus two restarts."""
    return job.deadline_s is not None and \
        job.deadline_s - now < job.work_s - done_s + 2 * (job.ready_s + job.restart_s)


@dataclass(frozen=True)
class Summary:
    """One strategy on one trace, over several start times. `regret`: mean and worst of each
    run's cost over on-demand's from the same start, less one (0.1: 10% dearer)."""

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
    mean_regret: float | None = None
    worst_regret: float | None = None


def summarize(results: list[SimResult], notice_s: float, horizon_s: float,
              on_demand: list[SimResult] | None = None) -> Summary:
    """The runs of one strategy on one trace (and, for regret, on-demand's from the same
    starts, in the same order)."""
    first = results[0]
    count = len(results)
    regrets = [r.cost_usd / od.cost_usd - 1 for r, od in zip(results, on_demand or [])
               if od.cost_usd > 0]
    return Summary(
        first.trace, notice_s, first.strategy, count,
        sum(r.cost_usd for r in results) / count,
        sum(min(r.finished_s, horizon_s) for r in results) / count / 3600,
        sum(not r.met_deadline for r in results),
        sum(r.preemptions for r in results) / count,
        sum(r.lost_work_s for r in results) / count / 3600,
        sum(r.on_demand_s for r in results) / count / 3600,
        sum(regrets) / len(regrets) if regrets else None,
        max(regrets) if regrets else None)


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
                round(1.0 - cast(float, figures["mean_cost_usd"]) / cast(float, on_demand), 4)
    return {"runs": [{"trace": trace, "notice_s": notice, "strategies": strategies}
                     for (trace, notice), strategies in runs.items()]}
