"""A simulated cloud and its training workers behind the job manager's cluster adaptor (the
Protocol raytrain.serve.adaptors.cluster.Cluster), on a simulated clock: what a trace replay
(raytrain.sim.replay) runs the live job manager, scheduler, provisioner and lifecycle on.

- Capacity: a spot node type's capacity comes and goes as its trace says; an on-demand one's
  is always there. Nodes the service asks for (`request_nodes`) are launched on capacity that
  is there and are up `ready_s` later; a node is kept while it is asked for or a run uses it,
  and let go once it has been neither for `idle_s` (the autoscaler's idle timeout; the idle
  tail after a job lets a node go is the cloud's bill, not the job's).
- Preemption: the trace's removal of a node the service holds takes it. A share of removals
  (the offer's cloud's, drawn per node with a fixed seed) come with the cloud's notice,
  `notice_s` ahead: the node's workers hear it as they would from the metadata service.
- Workers: each run is a simulated worker group that keeps the real loop's rules
  (raytrain.core.step_rules): it starts `restart_s` after its launch, resumes from its job's
  latest committed checkpoint, trains at the step time the planner predicts for its nodes,
  reports progress to the job manager every `report_s` and takes the manager's answers (stop,
  move, the checkpoint interval), checkpoints every checkpoint_every_steps, at the policy's
  interval and at the end (stalling `checkpoint_s`, committed at its end), checkpoints and
  stops after a notice or a move, and dies with its node.
- Bill: the cloud's own, each node from up to gone at its price, kept apart from the service's.

Written here because none of Ray's test clusters runs on a simulated clock, and a replay of
12 hours must take a second, not 12 hours.

    cloud = TraceCloud(types, CloudTimes())
    manager = JobManager(config, cluster=cloud, schedule=False).start(); cloud.manager = manager
    cloud.advance(cloud.next_time())
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from raytrain.catalog.traces import TraceEvent
from raytrain.core.fleet import notice_given
from raytrain.core.resolve import planner_inputs
from raytrain.core.throughput import job_throughput
from raytrain.sim.workers import CloudTimes, SimRun
from raytrain.spec import JobSpec, Layout, Offer

EPOCH = 1_800_000_000.0  # the simulated clock's start (a unix time)
HEAD = "head"


@dataclass(frozen=True)
class NodeType:
    """One node type the replayed service may buy: an offer in one market, and (spot) the
    capacity of its market as replayed events (raytrain.core.fleet.replay)."""

    name: str
    offer: Offer
    market: str
    events: tuple[TraceEvent, ...] | None = None  # None: always there (on-demand)
    notice: tuple[float, float] | None = None  # (seconds, share); None: the offer's cloud's

    @property
    def price(self) -> float:
        return self.offer.usd_per_hour(self.market) or 0.0

    def resources(self) -> dict[str, float]:
        gpus = float(self.offer.gpus_per_node) if self.offer.gpu_kind != "cpu" else 0.0
        return {self.name: 1.0, "CPU": 8.0 * max(1.0, gpus), "GPU": gpus}


def heal_seconds(spec: JobSpec, offer: Offer) -> float:
    """How long a replacement replica group takes to fetch the job's state from a live one:
    its weights and AdamW's two moments in fp32 (12 bytes a parameter), over one node's
    network."""
    if spec.model.planned_shape is None:
        return 0.0
    dims = planner_inputs(spec)[0]
    return 12.0 * dims.params / (offer.network_gbps * 1e9 / 8)


@dataclass
class Node:
    id: str  # unique per launch (a market's machine may be launched again later)
    kind: NodeType
    asked_at: float
    up_at: float  # when it is (or will be) up
    remove_at: float | None = None  # when the trace takes it back (None: not before the end)
    notice_at: float | None = None  # when its notice arrives, if it gets one
    gone_at: float | None = None
    machine: str = ""  # the trace's node it runs on (spot)
    announced: bool = False  # the cloud has seen it come up
    noticed: bool = False  # its notice was given
    idle_since: float | None = None  # unwanted since
    idle_before_s: float = 0.0  # earlier stretches unwanted

    @property
    def price(self) -> float:
        return self.kind.price


class TraceCloud:
    def __init__(self, types: Iterable[NodeType], times: CloudTimes, seed: int = 0,
                 start: float = EPOCH) -> None:
        self.types = {t.name: t for t in types}
        self.times = times
        self.time = self.start = start
        self.manager: Any = None  # the JobManager, once made
        self.nodes: dict[str, Node] = {}  # every node ever launched, by id
        self._maybe_live: dict[str, Node] = {}  # those not known to be gone
        self.requests: dict[str, list[dict[str, float]]] = {}
        self.runs: dict[str, SimRun] = {}  # by job id: the latest run
        self.committed: dict[str, int] = {}  # job id -> step of its latest checkpoint
        self.capacity: dict[str, set[str]] = {name: set() for name in self.types}
        self._removals: dict[str, float] = {}  # trace node -> when it goes
        self._seed = seed
        self._made = 0
        self._queue: list[tuple[float, int, str, str, str]] = []  # (t, seq, kind, type, node)
        self._seq = 0
        for kind in self.types.values():
            for event in kind.events or ():
                self._push(start + event.time_s, event.kind, kind.name, event.node)
                if event.kind == "remove":
                    self._removals.setdefault(f"{kind.name}/{event.node}",
                                              start + event.time_s)

    # -------------------------------------------------------------- the adaptor's interface

    def now(self) -> float:
        return self.time

    def launch(self, job_id: str, spec: JobSpec, layout: Layout, checkpoint_root: str,
               run_root: str, worker_resources: dict[str, float] | None,
               notice_endpoint: str | None) -> SimRun:
        kind = self.types[next(iter(worker_resources or {}))]
        share = next(iter((worker_resources or {}).values()))
        count = max(1, round(share * spec.resources.num_workers))
        busy = self._busy()
        free = sorted((n for n in self._up(kind.name) if n.id not in busy),
                      key=lambda n: (n.up_at, n.id))
        nodes = [n.id for n in free[:count]]
        fit = job_throughput(spec)(kind.offer, count)
        step_s = spec.tokens_per_step / fit[0] if fit else math.inf
        run = SimRun(self, job_id, spec, layout, nodes, step_s,
                     heal_seconds(spec, kind.offer), self.time)
        self.runs[job_id] = run
        return run

    def finished(self, handles: Mapping[str, SimRun]) -> set[str]:
        return {job_id for job_id, run in handles.items() if run.done}

    def outcome(self, handle: SimRun) -> str | None:
        return handle.error

    def stop(self, handle: SimRun, placement_group: str | None = None) -> None:
        handle.end(error=handle.error)
        self._reconcile()

    def total_resources(self) -> dict[str, float]:
        total: dict[str, float] = {"CPU": 4.0}
        for resources in self.node_resources()[1:]:
            for key, value in resources.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def node_resources(self) -> list[dict[str, float]]:
        return [{"CPU": 4.0}] + [n.kind.resources() for n in self._up()]

    def alive_nodes(self, with_resources: Iterable[str] = ()) -> frozenset[str]:
        wanted = set(with_resources)
        up = frozenset(n.id for n in self._up() if not wanted or n.kind.name in wanted)
        return up if wanted else up | {HEAD}

    def prepare_requests(self) -> None:
        pass  # requests are taken as they come

    def request_nodes(self, job_id: str, bundles: list[dict[str, float]]) -> None:
        self.requests[job_id] = bundles
        self._reconcile()

    def reclaim_runners(self) -> None:
        pass

    def reclaim_groups(self, owned: set[str], node_types: Iterable[str]) -> None:
        pass

    # -------------------------------------------------------------------- the clock

    def next_time(self) -> float:
        """When the next thing happens in the cloud or in a run (inf: nothing will)."""
        soonest = self._queue[0][0] if self._queue else math.inf
        for n in self._live():
            if not n.announced and n.up_at < soonest:
                soonest = n.up_at
            if n.notice_at is not None and self.time < n.notice_at < soonest:
                soonest = n.notice_at
            if n.idle_since is not None and n.idle_since + self.times.idle_s < soonest:
                soonest = n.idle_since + self.times.idle_s
        for run in self.runs.values():
            soonest = min(soonest, run.next_time())  # inf once done
        return soonest

    def advance(self, until: float, due: float | None = None) -> bool:
        """Let everything due by `until` happen, in time order (`due`: next_time(), when
        the caller has it); True if a node or a run changed (the scheduler should look)."""
        changed = False
        due = self.next_time() if due is None else due
        while due <= until:
            self.time = max(self.time, due)
            changed = self._fire() or changed
            due = self.next_time()
        self.time = max(self.time, until)
        return changed

    def bill_usd(self, until: float | None = None) -> float:
        """What the cloud bills: every node from up to gone (or `until`), at its price."""
        end = self.time if until is None else until
        return sum(n.price * max(0.0, min(n.gone_at or end, end) - n.up_at) / 3600
                   for n in self.nodes.values() if n.up_at <= end)

    def idle_usd(self) -> float:
        """The part of the bill for nodes no job held: the autoscaler's idle tails."""
        return sum(n.price * (n.idle_before_s + (0.0 if n.idle_since is None else max(
            0.0, (n.gone_at or self.time) - n.idle_since))) / 3600 for n in self.nodes.values())

    def node_seconds(self, market: str) -> float:
        return sum(max(0.0, (n.gone_at or self.time) - n.up_at) for n in self.nodes.values()
                   if n.kind.market == market and n.up_at <= self.time)

    # -------------------------------------------------------------------- internals

    def _push(self, t: float, kind: str, node_type: str, node: str) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (t, self._seq, kind, node_type, node))

    def _live(self) -> list[Node]:
        """Nodes not gone (launching or up)."""
        live = [n for n in self._maybe_live.values() if n.gone_at is None]
        if len(live) < len(self._maybe_live):
            self._maybe_live = {n.id: n for n in live}
        return live

    def _up(self, node_type: str | None = None) -> list[Node]:
        return [n for n in self._live() if n.up_at <= self.time
                and (node_type is None or n.kind.name == node_type)]

    def _fire(self) -> bool:
        now = self.time
        while self._queue and self._queue[0][0] <= now:
            _, _, kind, node_type, node = heapq.heappop(self._queue)
            if kind == "add":
                self.capacity[node_type].add(node)
            else:
                self.capacity[node_type].discard(node)
                self._take(node_type, node)
            self._reconcile()
            return True
        for live in self._live():
            if live.notice_at is not None and live.notice_at <= now:
                live.notice_at, live.noticed = None, True
                for run in self.runs.values():
                    if not run.done and live.id in run.using():
                        run.hear_notice(live.id, now)
        expired = [n for n in self._live() if
                   n.idle_since is not None and now - n.idle_since >= self.times.idle_s]
        if expired:
            self._reconcile()
            return True
        came = [n for n in self._live() if n.up_at <= now and not n.announced]
        for up in came:
            up.announced = True
        if came:
            self._offer_free(now)
            self._reconcile()
            return True
        for run in list(self.runs.values()):
            if not run.done and run.next_time() <= now:
                run.fire()
                if run.done:
                    self._reconcile()
                    return True
        return False

    def _take(self, node_type: str, machine: str) -> None:
        node = next((n for n in self._live()
                     if n.kind.name == node_type and n.machine == machine), None)
        if node is None:
            return
        node_id = node.id
        node.gone_at = self.time
        if node.up_at > self.time:  # still launching: nothing came up, nothing billed
            node.up_at = self.time
        for run in self.runs.values():
            if not run.done and node_id in run.using():
                run.node_lost(node_id, self.time)
        self._offer_free(self.time)

    def _busy(self) -> set[str]:
        return {n for run in self.runs.values() if not run.done for n in run.using()}

    def _offer_free(self, now: float) -> None:
        """Up nodes no run uses go to runs whose lost groups wait for one."""
        busy = self._busy()
        for node in sorted(self._up(), key=lambda n: (n.up_at, n.id)):
            if node.id in busy:
                continue
            for run in self.runs.values():
                if not run.done and run.elastic and run.nodes and \
                        self.nodes[run.nodes[0]].kind.name == node.kind.name and \
                        run.node_free(node.id, now):
                    busy.add(node.id)
                    break

    def _wanted(self, node_type: str) -> int:
        """The nodes of a type the cluster must have: the service's requests (for the
        cluster's whole size, as Ray's request_resources is) or what runs hold and wait for
        (their groups' own demand), whichever is more."""
        asked = sum(1 for bundles in self.requests.values() for b in bundles if node_type in b)
        used = sum(run.nodes_wanted() for run in self.runs.values() if not run.done
                   and run.nodes and self.nodes[run.nodes[0]].kind.name == node_type)
        return max(asked, used)

    def _reconcile(self) -> None:
        """Launch nodes up to what is asked for (where capacity is there), let go of the rest."""
        for kind in self.types.values():
            mine = [n for n in self._live() if n.kind.name == kind.name]
            wanted = self._wanted(kind.name)
            if len(mine) < wanted:
                for _ in range(wanted - len(mine)):
                    if not self._start_node(kind):
                        break
            busy = self._busy()
            # Let go of a node the cloud is taking back first, then the newest up, and a
            # launching one (a replacement on its way) last.
            idle = sorted((n for n in mine if n.id not in busy), key=lambda n: (
                n.remove_at is None or n.noticed is False, n.up_at > self.time, -n.up_at, n.id))
            surplus = {n.id for n in idle[:max(0, len(mine) - wanted)]}
            for node in mine:
                if node.id not in surplus:
                    if node.idle_since is not None:
                        node.idle_before_s += self.time - node.idle_since
                    node.idle_since = None
                elif node.up_at > self.time:  # still launching: cancelled, nothing billed
                    node.gone_at = node.up_at = self.time
                elif node.idle_since is None:
                    node.idle_since = self.time
                elif self.time - node.idle_since >= self.times.idle_s:
                    node.gone_at = self.time

    def _start_node(self, kind: NodeType) -> bool:
        now, ready = self.time, self.times.ready_s
        if kind.events is None:  # on-demand: always there
            self._made += 1
            node_id = f"{kind.name}/{self._made}"
            self._add(Node(node_id, kind, now, now + ready))
            return True
        held = {n.machine for n in self._live() if n.kind.name == kind.name}
        free = sorted(n for n in self.capacity[kind.name] if n not in held)
        if not free:
            return False
        self._made += 1
        node_id = f"{kind.name}/{free[0]}/{self._made}"
        node = Node(node_id, kind, now, now + ready,
                    remove_at=self._removals.get(f"{kind.name}/{free[0]}"), machine=free[0])
        seconds, share = kind.notice if kind.notice is not None else kind.offer.notice
        if node.remove_at is not None and seconds > 0 and notice_given(
                free[0], node.remove_at - self.start, share, self._seed):
            node.notice_at = max(node.up_at, node.remove_at - seconds)
        self._add(node)
        return True

    def _add(self, node: Node) -> None:
        self.nodes[node.id] = node
        self._maybe_live[node.id] = node
