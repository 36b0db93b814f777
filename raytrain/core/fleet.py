"""A spot fleet's recorded life (a trace), the job replayed on it, and what came of it: the
values the simulator's strategies (raytrain.core.simulate) and the hindsight-optimal schedule
(raytrain.core.hindsight) share.

    events = replay(trace, start_s=3600, horizon_s=12 * 3600)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from raytrain.catalog.spot_trace import Trace, TraceEvent
from raytrain.spec import Offer

__all__ = ["Trace", "TraceEvent", "Fleet", "SimJob", "SimResult", "replay", "notice_given"]


def notice_given(node: str, removal_s: float, share: float, seed: int = 0) -> bool:
    """Whether the removal of `node` at `removal_s` (from the replay's start) comes with the
    cloud's notice: a draw with a fixed seed per node and time, so every simulation of one
    trace and start gives the same removals their notices."""
    return share > 0 and random.Random(f"{seed}:{node}@{removal_s:.3f}").random() < share


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
    """A job of `work_s` seconds of training on `nodes` nodes of `offer`, for the strategies
    simulated outside the live service (raytrain.core.simulate, raytrain.core.hindsight);
    `alternatives` are other fleets the oracle may choose instead. The cloud's figures are the
    replay's (raytrain.sim.trace_cloud.CloudTimes): nodes are up `ready_s` after they are
    asked for and billed from then; a group starts `restart_s` after its nodes are up."""

    offer: Offer
    nodes: int
    work_s: float
    deadline_s: float | None
    checkpoint_cost_s: float = 60.0
    restart_s: float = 30.0  # capacity in hand to the first step again
    ready_s: float = 120.0  # asking for a node to its being up (not billed)
    fixed_interval_s: float = 3600.0  # a fixed checkpoint interval, where one is used
    notice_s: float = 0.0  # warning before a preemption (AWS: 120); 0 = none
    notice_share: float = 1.0  # the share of preemptions that get it
    step_s: float = 10.0  # simulation resolution
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
    # and waiting for the rest of a group; empty for the hindsight schedule and replays.
    cost_by_phase: dict[str, float] = field(default_factory=dict)
    cloud_usd: float | None = None  # a replay: what the cloud billed (cost_usd: the service)
    # A replay: node-seconds billed to the job that trained nothing and did not checkpoint
    # (restarts, waits, stalls, redone work, missing groups' shares), per preemption.
    preemption_node_s: float | None = None


def replay(trace: Trace, start_s: float, horizon_s: float) -> list[TraceEvent]:
    """The trace from `start_s` on, as events in time from the start, repeated end to end
    until `horizon_s`: the fleet alive at `start_s` arrives at time 0. At each seam (the
    trace's span) the fleet carries on: nodes alive at the end of a lap stand for the nodes
    the next lap starts with, and only a surplus leaves (or a shortfall arrives) there, so a
    constant trace stays constant. Each node that arrives gets a name of its own
    (`name#n`), also when the trace reuses a name."""
    span = trace.duration_s
    start_s = start_s % span if span > 0 else 0.0
    out: list[TraceEvent] = []
    ids: dict[str, str] = {}  # the trace's node name -> the fleet's node id, this lap
    begin, offset = start_s, -start_s  # offset: the replay time of the lap's trace time 0
    made = 0

    def fresh(name: str) -> str:
        nonlocal made
        made += 1
        return f"{name}#{made}"

    while begin + offset <= horizon_s:
        seam = max(0.0, begin + offset)
        carried = [ids[name] for name in sorted(ids)]
        ids = {}
        for name in trace.alive_at(begin):
            if carried:
                ids[name] = carried.pop(0)
            else:
                ids[name] = fresh(name)
                out.append(TraceEvent(seam, "add", ids[name]))
        out.extend(TraceEvent(seam, "remove", node) for node in carried)
        for event in trace.events:
            if event.time_s <= begin:
                continue
            t = event.time_s + offset
            if t > horizon_s:
                return out
            if event.kind == "add" and event.node not in ids:
                ids[event.node] = fresh(event.node)
                out.append(TraceEvent(t, "add", ids[event.node]))
            elif event.kind == "remove" and event.node in ids:
                out.append(TraceEvent(t, "remove", ids.pop(event.node)))
        begin, offset = 0.0, offset + span
        if span <= 0:
            break
    return out
