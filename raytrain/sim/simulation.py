"""The simulator's tables: one job, every way of buying its capacity, from start times spread
over a spot trace, with and without the cloud's notice. The policy (with its elastic replica
groups, and rigid: every preemption stops the job) and the baselines that are policies (all
rigid) are replayed through the live service (raytrain.sim.replay); Uniform Progress and
the hindsight-optimal schedule (the cheaper of the rigid schedule and the bound for schedules
that train on survivors) are computed beside them under the same cloud figures
(raytrain.core.simulate, raytrain.core.hindsight). `raytrain simulate` and
benchmarks/spot_simulation.py print these.

    rows = simulate_trace(TraceJob(trace, offer, nodes=8, work_s=6 * 3600,
                                   deadline_s=12 * 3600), policy, starts=11)
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Callable

from raytrain.catalog.traces import Trace
from raytrain.core.elastic import groups_of
from raytrain.core.fleet import SimJob, SimResult
from raytrain.core.hindsight import elastic_bound, hindsight
from raytrain.core.simulate import STRATEGIES, Summary, summarize, uniform_progress
from raytrain.errors import FieldError, SpecError
from raytrain.sim.replay import (
    BASELINES,
    Market,
    Replayed,
    Scenario,
    as_sim_result,
    baseline_policies,
    gpt_job,
    replay_job,
    sim_job,
    with_policy,
)
from raytrain.sim.workers import CloudTimes
from raytrain.spec import JobSpec, Offer, PolicySpec

NO_NOTICE = (0.0, 0.0)


@dataclass(frozen=True)
class TraceJob:
    """One row set of the tables: a job on `nodes` of `offer`, whose spot capacity is `trace`,
    and what the cloud tells before a preemption (`notice`: (seconds, share); None: the
    offer's cloud's; NO_NOTICE: none)."""

    trace: Trace
    offer: Offer
    nodes: int
    work_s: float
    deadline_s: float | None
    notice: tuple[float, float] | None = None
    times: CloudTimes = CloudTimes()
    fixed_interval_s: float = 1800.0  # the `spot` and `failover` baselines' interval
    spec: JobSpec | None = None  # a job of the user's; None: gpt_job's
    alternatives: tuple[Market, ...] = ()  # other markets the policy (only) may buy

    @property
    def notice_s(self) -> float:
        return (self.notice or self.offer.notice)[0]


def check_trace_job(job: TraceJob) -> None:
    """Refuse what cannot be replayed, naming the fix: a node count above the fleet's."""
    if job.nodes > job.trace.max_nodes:
        raise SpecError([FieldError(("nodes",), (
            f"{job.nodes} nodes, but the trace {job.trace.name!r} never has more than "
            f"{job.trace.max_nodes} alive at once, so the job could never run on spot. To fix: "
            f"use --nodes {job.trace.max_nodes} or fewer, or a trace of a larger fleet"))],
            "simulation")
    if job.offer.spot_usd_per_hour is None or job.offer.on_demand_usd_per_hour is None:
        raise SpecError([FieldError(("instance",), (
            f"{job.offer.instance_type} has no spot and on-demand prices. To fix: choose an "
            "offer with both"))], "simulation")


def simulate_trace(job: TraceJob, policy: PolicySpec, starts: int,
                   strategies: tuple[str, ...] = STRATEGIES, processes: int = 1
                   ) -> list[Summary]:
    """Every strategy from `starts` start times spread evenly over the trace."""
    return simulate_jobs([job], policy, starts, strategies, processes)


def simulate_jobs(jobs: list[TraceJob], policy: PolicySpec, starts: int,
                  strategies: tuple[str, ...] = STRATEGIES, processes: int = 1,
                  done: Callable[[int], None] | None = None) -> list[Summary]:
    """simulate_trace for jobs on one trace that differ only in what the cloud tells before
    a preemption (the notices to compare): each start time's replays of all of them in one
    task, so the hindsight schedule (which knows every preemption, notice or not) is solved
    once per start. `done(n)`: n more start times replayed, for a progress bar."""
    for job in jobs:
        check_trace_job(job)
    trace = jobs[0].trace
    times = [trace.duration_s * i / starts for i in range(starts)]
    args = [(tuple(jobs), policy, start, strategies) for start in times]
    by_start: list[list[dict[str, SimResult]]] = [[] for _ in times]
    if processes > 1:
        with ProcessPoolExecutor(processes) as pool:
            futures = {pool.submit(_one_start, a): i for i, a in enumerate(args)}
            for future in as_completed(futures):
                by_start[futures[future]] = future.result()
                if done is not None:
                    done(1)
    else:
        for i, a in enumerate(args):
            by_start[i] = _one_start(a)
            if done is not None:
                done(1)
    rows = []
    for j, job in enumerate(jobs):
        horizon = 20 * job.work_s + (job.deadline_s or 0)
        on_demand = [runs[j]["on-demand"] for runs in by_start] \
            if "on-demand" in strategies else None
        for strategy in strategies:
            results = [runs[j][strategy] for runs in by_start]
            rows.append(summarize(results, job.notice_s, horizon, on_demand))
    return rows


@dataclass(frozen=True)
class Start:
    """One start time of a trace job, as each strategy sees it: the job as the service runs
    it (`scenario`, on its own markets `own`) and as the trace-level strategies do
    (`outside`: Uniform Progress and the oracle)."""

    job: TraceJob
    policy: PolicySpec
    start: float
    spec: JobSpec
    scenario: Scenario
    own: tuple[Market, Market]
    outside: SimJob
    # The service's replays so far, by (policy, rigid): a job of one replica group is rigid,
    # so its `policy` row is its `policy-rigid` replay, replayed once.
    # The hindsight schedules solved for this start, by the job without its notice: neither
    # bound depends on one, so the notices compared share them.
    oracles: dict[SimJob, SimResult] = field(default_factory=dict, compare=False)
    replayed: dict[tuple[str, bool], Replayed] = field(default_factory=dict, compare=False)

    @property
    def one_group(self) -> bool:
        return groups_of(self.spec, self.spec.parallel.dp_replicate or self.job.nodes,
                         self.job.nodes) <= 1


def _uniform_progress(s: Start) -> SimResult:
    return uniform_progress(s.job.trace, s.outside, s.policy, s.start)


def _oracle(s: Start) -> SimResult:
    """The cheaper bound: the rigid hindsight schedule, or (with replica groups) training on
    survivors."""
    key = replace(s.outside, notice_s=0.0, notice_share=1.0)
    if key not in s.oracles:
        rigid = hindsight(s.job.trace, s.outside, s.start)
        s.oracles[key] = rigid if s.one_group else min(
            (rigid, elastic_bound(s.job.trace, s.outside, s.start)), key=lambda r: r.cost_usd)
    return s.oracles[key]


def _replayed(strategy: str) -> Callable[[Start], SimResult]:
    """A strategy the live service runs (raytrain.sim.replay): the policy, elastic or
    rigid, on every market it may buy; a baseline policy, rigid, on the job's own."""
    ours = strategy in ("policy", "policy-rigid")

    def run(s: Start) -> SimResult:
        markets = s.own + s.job.alternatives if ours else s.own
        rigid = strategy != "policy" or s.one_group
        policy = s.policy.name if ours else strategy
        if (policy, rigid) not in s.replayed:
            spec = _rigid(s.spec) if rigid else s.spec
            s.replayed[policy, rigid] = replay_job(with_policy(
                replace(s.scenario, markets=markets, spec=spec), policy), s.start)
        return as_sim_result(s.replayed[policy, rigid], strategy, s.job.trace.name, s.start,
                             s.outside.deadline_s)
    return run


# Each strategy of the tables by name (raytrain.core.simulate.STRATEGIES, in its order).
STRATEGY_RUNS: dict[str, Callable[[Start], SimResult]] = {
    "uniform-progress": _uniform_progress, "oracle": _oracle,
    **{name: _replayed(name) for name in (*BASELINES, "policy-rigid", "policy")},
}


def _one_start(args: tuple[tuple[TraceJob, ...], PolicySpec, float, tuple[str, ...]]
               ) -> list[dict[str, SimResult]]:
    jobs, policy, start, strategies = args
    oracles: dict[SimJob, SimResult] = {}  # by the job without its notice (module doc)
    found = []
    for job in jobs:
        spec = job.spec or gpt_job(job.offer, job.nodes, job.work_s, job.deadline_s,
                                   policy.name)
        policies = baseline_policies(policy, job.fixed_interval_s)
        own = (Market(job.offer, "spot", job.trace), Market(job.offer, "on-demand"))
        seconds, share = job.notice or job.offer.notice
        outside = replace(sim_job(spec, job.offer, job.times, seconds, job.fixed_interval_s),
                          notice_share=share)
        at = Start(job, policy, start, spec, Scenario(spec, own, policies, job.times,
                                                      job.notice), own, outside, oracles)
        found.append({strategy: STRATEGY_RUNS[strategy](at) for strategy in strategies})
    return found


def _rigid(spec: JobSpec) -> JobSpec:
    """The job without elastic replica groups: every preemption stops it (the baselines,
    and the policy as it was before replica groups trained on)."""
    return spec.model_copy(update={"parallel": spec.parallel.model_copy(
        update={"elastic": False})})


def repaired_late_runs(job: TraceJob, policy: PolicySpec, starts: int,
                       every_s: float = 120.0) -> list[tuple[float, SimResult, SimResult | None]]:
    """Each start where Uniform Progress finishes late, with the same run moved to on-demand
    to the end at the one moment (tried every `every_s`) that finishes in time for least."""
    spec = job.spec or gpt_job(job.offer, job.nodes, job.work_s, job.deadline_s, policy.name)
    seconds, share = job.notice or job.offer.notice
    outside = replace(sim_job(spec, job.offer, job.times, seconds, job.fixed_interval_s),
                      notice_share=share)
    found = []
    for start in (job.trace.duration_s * i / starts for i in range(starts)):
        late = uniform_progress(job.trace, outside, policy, start)
        if late.met_deadline or outside.deadline_s is None:
            continue
        tries = (uniform_progress(job.trace, outside, policy, start, on_demand_from_s=float(s))
                 for s in range(0, int(outside.deadline_s), int(every_s)))
        punctual = min((r for r in tries if r.met_deadline), key=lambda r: r.cost_usd,
                       default=None)
        found.append((start, late, punctual))
    return found


def finite_hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}" if math.isfinite(seconds) else "never"
