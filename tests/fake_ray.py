"""A recording stand-in for the job manager's Ray adaptor (raytrain.serve.ray_cluster): runs
that start and end when the test says, nodes the test adds and takes, a clock the test moves,
and a log of every call. With it the job manager and the HTTP API run in one process.

    cluster = FakeRay(cpus=4)
    manager = JobManager(config, cluster=cluster, schedule=False)
    manager.scheduler.pass_once()          # launches what fits
    cluster.finish(job_id)                 # its runner returns (or: error="...")
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


@dataclass
class FakeRun:
    job_id: str
    spec: dict[str, Any]
    layout: dict[str, Any]
    worker_resources: dict[str, float] | None
    done: bool = False
    error: str | None = None


@dataclass
class FakeRay:
    cpus: float = 4.0
    gpus: float = 0.0
    time: float = 1_700_000_000.0
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    runs: dict[str, FakeRun] = field(default_factory=dict)  # by job id: the latest run
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    requests: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    groups: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.nodes:
            self.nodes["head"] = {"CPU": self.cpus, "GPU": self.gpus}

    # the adaptor's interface -------------------------------------------------------------

    def now(self) -> float:
        return self.time

    def launch(self, job_id: str, spec_json: dict[str, Any], layout_json: dict[str, Any],
               checkpoint_root: str, run_root: str, worker_resources: dict[str, float] | None,
               notice_endpoint: str | None) -> FakeRun:
        run = FakeRun(job_id, spec_json, layout_json, worker_resources)
        self.runs[job_id] = run
        self.calls.append(("launch", job_id))
        return run

    def finished(self, handles: Mapping[str, FakeRun]) -> set[str]:
        return {job_id for job_id, run in handles.items() if run.done}

    def outcome(self, handle: FakeRun) -> str | None:
        return handle.error

    def stop(self, handle: FakeRun, placement_group: str | None = None) -> None:
        handle.done = True
        self.groups.discard(placement_group or "")
        self.calls.append(("stop", handle.job_id, placement_group))

    def total_resources(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for resources in self.nodes.values():
            for key, value in resources.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def node_resources(self) -> list[dict[str, float]]:
        return list(self.nodes.values())

    def alive_nodes(self, with_resources: Iterable[str] = ()) -> frozenset[str]:
        wanted = set(with_resources)
        return frozenset(node for node, resources in self.nodes.items()
                         if not wanted or wanted & set(resources))

    def request_nodes(self, job_id: str, bundles: list[dict[str, float]]) -> None:
        self.requests[job_id] = bundles
        self.calls.append(("request", job_id, len(bundles)))

    def reclaim_runners(self) -> None:
        self.calls.append(("reclaim_runners",))

    def reclaim_groups(self, owned: set[str], node_types: Iterable[str]) -> None:
        self.groups &= owned
        self.calls.append(("reclaim_groups", frozenset(owned)))

    # what the test does -------------------------------------------------------------------

    def finish(self, job_id: str, error: str | None = None) -> None:
        run = self.runs[job_id]
        run.done, run.error = True, error

    def advance(self, seconds: float) -> None:
        self.time += seconds
