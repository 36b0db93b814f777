"""The hindsight-optimal schedule: the cheapest way to finish a simulated job by its deadline
when every preemption in the trace is known in advance. No policy can pay less on that trace
(under the simulator's rules), so it is the yardstick for the policy's gap.

How: exact dynamic programming on the simulator's time grid over (time step, steps of work
done, mode), solved backwards in time and vectorised over the work done with numpy.
- Modes: idle (holding nothing) and on-demand (running). Spot runs are taken whole.
- Knowing the future, a spot run holds the `nodes` live nodes that live longest, and it ends
  when the first of them is removed. The job checkpoints just before (job.checkpoint_cost_s,
  billed), so nothing is lost. Every run, spot or on-demand, starts with job.ready_s (its
  nodes coming up: not billed, as the cloud bills a node from when it is up) and then
  job.restart_s (billed, no progress).
- A spot run lasts as long as it can: leaving spot early never pays, since spot is the cheaper
  capacity at the same speed and the next run starts with another restart.
- On-demand may stop after any step (a checkpoint, then idle), for example to wait for spot.
- V(t, p, mode) = min over the moves of (their bill + V(after)); V = 0 once the work is done,
  inf past the deadline (or the simulator's horizon when there is none).

Nodes are billed only while held: unlike the strategies, the schedule never waits holding part
of its group, so it is a lower bound. The grid is the simulator's step (10 s); a job whose grid
would pass `MAX_CELLS` is solved on a coarser one, a multiple of it.

    best = hindsight(trace, job, start_s=0.0)   # a SimResult, strategy "oracle"
"""

from __future__ import annotations

import math

import numpy as np

from raytrain.catalog.prices import usd_for
from raytrain.core.fleet import SimJob, SimResult, Trace, replay

MAX_CELLS = 12_000_000  # (time steps x work steps) per table: 48 MB each in float32


def spot_run_ends(trace: Trace, job: SimJob, start_s: float, steps: int, dt: float
                  ) -> np.ndarray:
    """For each step k, the step at which a spot run started at k ends: the first removal
    among the `nodes` live nodes that live longest (k itself when fewer are live). Events are
    seen at the first step at or after their time, as the simulator sees them."""
    horizon = steps * dt
    born: dict[str, int] = {}
    dies: dict[str, int] = {}
    for event in replay(trace, start_s, horizon):
        k = math.ceil(event.time_s / dt - 1e-9)
        if event.kind == "add":
            born[event.node] = k
        else:
            dies[event.node] = k
    by_step: dict[int, list[str]] = {}
    for node, k in born.items():
        by_step.setdefault(k, []).append(node)
    ends = np.arange(steps + 1)
    alive: set[str] = set()
    for k in range(steps + 1):
        alive.update(by_step.get(k, ()))
        alive = {node for node in alive if dies.get(node, steps + 1) > k}
        if len(alive) >= job.nodes:
            ends[k] = sorted((dies.get(node, steps + 1) for node in alive),
                             reverse=True)[job.nodes - 1]
    return ends


def hindsight(trace: Trace, job: SimJob, start_s: float = 0.0) -> SimResult:
    """The cheapest schedule that finishes by the deadline, knowing the trace (module doc)."""
    limit_s = job.deadline_s if job.deadline_s is not None else job.horizon_s
    dt = job.step_s
    while math.floor(limit_s / dt) * (math.ceil(job.work_s / dt) + 1) > MAX_CELLS:
        dt *= 2
    last, work = math.floor(limit_s / dt), math.ceil(job.work_s / dt - 1e-9)
    restart, save = math.ceil(job.restart_s / dt - 1e-9), math.ceil(job.checkpoint_cost_s / dt
                                                                     - 1e-9)
    boot = math.ceil(job.ready_s / dt - 1e-9)
    od_step = usd_for(job.offer.usd_per_hour("on-demand") or math.inf, dt, job.nodes)
    spot_price = job.offer.usd_per_hour("spot")
    spot_step = usd_for(spot_price, dt, job.nodes) if spot_price else math.inf
    ends = spot_run_ends(trace, job, start_s, last, dt) if spot_price else \
        np.arange(last + 1)
    idle = np.full((last + 2, work + 1), np.inf, dtype=np.float32)  # row last+1: too late
    od = np.full((last + 2, work + 1), np.inf, dtype=np.float32)
    idle[:, work] = od[:, work] = 0.0
    left = work - np.arange(work)  # steps of work still to do, for p = 0 .. work-1
    finished_in_run = spot_step * (restart + left)  # a spot run that finishes the work
    cost = np.empty(work, dtype=np.float64)  # spot_option's, filled afresh each step
    shifted = np.zeros(work, dtype=np.float64)  # od's next row, one step of work on

    def row(table: np.ndarray, k: int) -> np.ndarray:
        return table[min(k, last + 1), :work]

    def spot_option(k: int) -> np.ndarray:
        span = min(int(ends[k]), last) - k  # steps the run can hold its nodes, in time
        room = span - boot - restart
        # Work done p finishes within the run when left[p] <= room: from p = first on.
        first = min(work, max(0, work - room))
        cost[first:] = finished_in_run[first:]
        m = room - save  # work in a run that must checkpoint at its end
        upto = min(first, work - m) if 1 <= m < work else 0  # (m >= work finishes anyway)
        if upto > 0:
            cost[:upto] = spot_step * (span - boot) + row(idle, k + span)[m:m + upto]
        cost[upto:first] = np.inf
        return cost

    for k in range(last - 1, -1, -1):  # at `last` (the deadline) only finished work is worth 0
        shifted[:-1] = row(od, k + 1)[1:]
        od[k, :work] = np.minimum(od_step + shifted, od_step * save + row(idle, k + save))
        idle[k, :work] = np.minimum(np.minimum(row(idle, k + 1), od_step * restart
                                               + row(od, k + boot + restart)), spot_option(k))
    return _follow(trace, job, start_s, dt, idle, od, ends, (work, boot, restart, save, last),
                   (od_step, spot_step))


def _follow(trace: Trace, job: SimJob, start_s: float, dt: float, idle: np.ndarray,
            od: np.ndarray, ends: np.ndarray, grid: tuple[int, int, int, int, int],
            prices: tuple[float, float]) -> SimResult:
    """Walk the solved tables from the start and bill the schedule they choose."""
    work, boot, restart, save, last = grid
    od_step, spot_step = prices
    result = SimResult("oracle", trace.name, start_s, math.inf, 0.0, 0, 0.0, 0.0, False)

    def at(table: np.ndarray, k: int, p: int) -> float:
        return 0.0 if p >= work else float(table[min(k, last + 1), p])

    if not math.isfinite(at(idle, 0, 0)):
        result.decisions.append("0 h: nothing finishes by the deadline, even with hindsight")
        return result
    k, p, mode = 0, 0, "idle"
    while p < work and k <= last:
        if mode == "od":
            if od_step + at(od, k + 1, p + 1) <= od_step * save + at(idle, k + save, p):
                result.cost_usd += od_step
                result.on_demand_s += dt
                k, p = k + 1, p + 1
            else:
                result.cost_usd += od_step * save
                result.on_demand_s += save * dt
                k, mode = k + save, "idle"
            continue
        span = min(int(ends[k]), last) - k
        room = span - boot - restart
        m = min(work - p, room - (0 if work - p <= room else save))
        spot = math.inf
        if m >= 1:
            ran = boot + restart + m + (save if p + m < work else 0)
            spot = spot_step * (ran - boot) + at(idle, k + ran, p + m)
        wait, buy = at(idle, k + 1, p), od_step * restart + at(od, k + boot + restart, p)
        if spot <= min(wait, buy):
            result.cost_usd += spot_step * (ran - boot)
            result.decisions.append(f"{k * dt / 3600:.2f} h: spot for {ran * dt / 3600:.2f} h")
            result.preemptions += p + m < work
            k, p = k + ran, p + m
        elif wait <= buy:
            k += 1
        else:
            result.decisions.append(f"{k * dt / 3600:.2f} h: on-demand")
            result.cost_usd += od_step * restart
            result.on_demand_s += (boot + restart) * dt
            k, mode = k + boot + restart, "od"
    result.finished_s = k * dt if p >= work else math.inf
    result.met_deadline = job.deadline_s is None or result.finished_s <= job.deadline_s
    return result


def elastic_bound(trace: Trace, job: SimJob, start_s: float = 0.0) -> SimResult:
    """A lower bound for schedules that may also train on fewer nodes than the job's while
    some are missing (an elastic job's replica groups): every node-second of work runs on the
    cheapest capacity there is, spot node-seconds first (at most the job's nodes at once,
    before the deadline), the rest on-demand, after one start (ready, then a billed restart)
    and with no checkpoint, stall or lost work. No schedule, rigid or elastic, pays less."""
    limit_s = job.deadline_s if job.deadline_s is not None else job.horizon_s
    start = job.ready_s + job.restart_s
    need = job.work_s * job.nodes  # node-seconds of work
    available, alive, last = 0.0, 0, start
    for event in replay(trace, start_s, limit_s):
        t = min(max(event.time_s, start), limit_s)
        available += min(alive, job.nodes) * (t - last)
        last = t
        alive += 1 if event.kind == "add" else -1
    available += min(alive, job.nodes) * max(0.0, limit_s - last)
    spot = min(need, available)
    spot_price = job.offer.usd_per_hour("spot") or math.inf
    od_price = job.offer.usd_per_hour("on-demand") or math.inf
    result = SimResult("oracle", trace.name, start_s, math.inf, 0.0, 0, 0.0, 0.0, False)
    cheapest_start = min(spot_price, od_price) if available else od_price
    result.cost_usd = usd_for(spot_price, spot) + usd_for(od_price, need - spot) + \
        usd_for(cheapest_start, job.restart_s, job.nodes)
    result.on_demand_s = (need - spot) / job.nodes
    result.finished_s = start + job.work_s  # at the earliest
    result.met_deadline = job.deadline_s is None or result.finished_s <= job.deadline_s
    result.decisions.append("a bound: every node-second of spot there was, then on-demand")
    return result
