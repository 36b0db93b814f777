"""A spot fleet's recorded life (a trace), the job replayed on it, and what came of it: the
values the simulator's strategies (raytrain.core.simulate) and the hindsight-optimal schedule
(raytrain.core.hindsight) share.

    events = replay(trace, start_s=3600, horizon_s=12 * 3600)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raytrain.spec import Offer


@dataclass(frozen=True)
class TraceEvent:
    time_s: float
    kind: str  # add | remove
    node: str


@dataclass(frozen=True)
class Trace:
    name: str
    events: tuple[TraceEvent, ...]
    duration_s: float


@dataclass(frozen=True)
class Fleet:
    """One way to run a job: `nodes` of `offer`, whose spot capacity comes and goes as in
    `trace`, training at `speed` times the job's own rate (the work takes work_s / speed)."""

    offer: Offer
    nodes: int
    trace: Trace
    speed: float = 1.0


@dataclass(frozen=True)
class SimJob:
    """A job of `work_s` seconds of training on `nodes` nodes of `offer`; `alternatives`
    are other fleets the policy (and the oracle) may choose instead, or move to."""

    offer: Offer
    nodes: int
    work_s: float
    deadline_s: float | None
    checkpoint_cost_s: float = 60.0
    restart_s: float = 300.0  # capacity in hand to the first step again
    fixed_interval_s: float = 3600.0  # the `spot` and `failover` checkpoint interval
    notice_s: float = 0.0  # warning before a preemption (AWS: 120); 0 = none
    step_s: float = 10.0  # simulation resolution
    recheck_s: float = 900.0
    alternatives: tuple[Fleet, ...] = ()

    @property
    def horizon_s(self) -> float:
        """How long a simulation runs the job before calling it unfinished."""
        return self.work_s * 20 + (self.deadline_s or 0)


@dataclass
class SimResult:
    strategy: str
    trace: str
    start_s: float
    finished_s: float
    cost_usd: float
    preemptions: int
    lost_work_s: float
    on_demand_s: float
    met_deadline: bool
    decisions: list[str] = field(default_factory=list)
    # What the bill paid for (raytrain.core.simulate): training, restarting, checkpointing,
    # and waiting for the rest of a group; empty for the hindsight schedule.
    cost_by_phase: dict[str, float] = field(default_factory=dict)


def replay(trace: Trace, start_s: float, horizon_s: float) -> list[TraceEvent]:
    """The trace from `start_s`, repeated end to end, as events in time from the start (what
    happened before the start arrives at time 0). Across a lap's seam the fleet carries on:
    the new lap's first adds are the nodes still alive, and only the surplus leaves."""
    out: list[TraceEvent] = []
    alive: set[str] = set()
    carry: list[str] = []
    lap, base = 0, -start_s
    while base <= horizon_s:
        names: dict[str, str] = {}
        for event in trace.events:
            t = max(0.0, event.time_s + base)
            if t > horizon_s:
                break
            if carry and event.time_s > 0:  # the lap's opening adds are done
                out.extend(TraceEvent(t, "remove", node) for node in carry)
                alive.difference_update(carry)
                carry = []
            if event.kind == "add":
                node = carry.pop(0) if carry else f"{event.node}#{lap}"
                names[event.node] = node
                if node not in alive:
                    alive.add(node)
                    out.append(TraceEvent(t, "add", node))
            elif event.node in names:
                node = names.pop(event.node)
                alive.discard(node)
                out.append(TraceEvent(t, "remove", node))
        carry = sorted(alive)
        lap += 1
        base += trace.duration_s
    return out
