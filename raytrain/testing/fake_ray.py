"""A recording stand-in for the job manager's Ray adaptor
(raytrain.serve.adaptors.ray_cluster): runs
that start and end when the test says, nodes the test adds and takes, a clock the test moves,
and a log of every call. With it the job manager and the HTTP API run in one process.

    cluster = FakeRay(cpus=4)
    manager = JobManager(config, cluster=cluster, schedule=False).start()
    manager.scheduler.pass_once()          # launches what fits
    cluster.finish(job_id)                 # its runner returns (or: error="...")
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from raytrain.spec import JobSpec, Layout, parse_job_spec
from raytrain.train.progress import ServiceAnswer


@dataclass
class FakeRun:
    job_id: str
    spec: JobSpec
    layout: Layout
    worker_resources: dict[str, float] | None
    checkpoint_root: str = ""  # where the service told its workers to write
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

    def launch(self, job_id: str, spec: JobSpec, layout: Layout, checkpoint_root: str,
               run_root: str, worker_resources: dict[str, float] | None,
               notice_endpoint: str | None) -> FakeRun:
        run = FakeRun(job_id, spec, layout, worker_resources, checkpoint_root)
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

    def prepare_requests(self) -> None:
        self.calls.append(("prepare_requests",))

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


class NodeLost(Exception):
    """Raised in a run's thread when its node is taken without notice: the rank dies there."""


class StepNotices:
    """A node's interruption notice, heard at the step the test chose (what the workers'
    metadata watcher, raytrain.cloud.interruption.Watcher, tells the loop)."""

    def __init__(self) -> None:
        self.stop_requested = False
        self.noticed_at: float | None = None

    def take_checkpoint_request(self) -> bool:
        return False

    def hear(self) -> None:
        self.stop_requested, self.noticed_at = True, time.time()


class DirectSink:
    """What rank 0's raytrain.train.launcher.ManagerSink sends through Ray, as plain calls on
    the manager in this process; and the place a fault planned for a step happens."""

    def __init__(self, cluster: TrainingRay, run: FakeRun, node: str | None) -> None:
        self.cluster, self.run, self.node = cluster, run, node
        self.notices = StepNotices()
        self.attempt, self.answer = 0, ServiceAnswer()

    def started(self, resumed_step: int) -> None:
        self.attempt = self.cluster.manager.worker_group_started(
            self.run.job_id, resumed_step, {"placement_group": None, "nodes": 1})
        self.answer.stop = self.attempt < 0

    def progress(self, payload: dict[str, Any]) -> None:
        cluster = self.cluster
        if payload["step"] == cluster.hold_at:
            cluster.held.set()
            cluster.go.wait(60)
        notice = cluster.faults.get(payload["step"]) if self.node else None
        if notice is not None:
            cluster.faults.pop(payload["step"])
            if not notice:  # taken at once: no checkpoint of this step, no report
                cluster.take(self.node)
                raise NodeLost(f"the node {self.node} was lost")
            self.notices.hear()  # checkpoint and stop at the next step
        self.answer.take(cluster.manager.report_progress(
            self.run.job_id, self.attempt, {**payload, "sent_at": time.time()}))

    def should_stop(self) -> bool:
        return self.answer.stop

    def should_move(self) -> bool:
        return self.answer.move

    def checkpoint_every_s(self) -> float | None:
        return self.answer.checkpoint_every_s

    def checkpoint(self, step: int, path: str, save_s: float,
                   durable_s: float | None = None) -> None:
        self.cluster.manager.report_checkpoint(self.run.job_id, self.attempt, step, path,
                                               save_s, durable_s)

    def finished(self, result: dict[str, Any]) -> None:
        self.cluster.manager.report_finished(self.run.job_id, self.attempt, result)


@dataclass
class TrainingRay(FakeRay):
    """A FakeRay whose runs train for real: each in a thread of this process, as one rank,
    reporting straight to the job manager (`manager`, set once it exists). It is also the
    autoscaler and the cloud: `autoscale()` adds a node (2 CPUs and its type's resource) for
    each node requested and missing. `faults` maps a training step to how the run's node goes
    there: True, after a notice (the run checkpoints and stops one step later, then the cloud
    takes the node); False, at once (the rank dies there, its node gone). At `hold_at` the
    run sets `held` and waits for `go` before it reports that step.

        cluster = TrainingRay(cpus=1, faults={30: True, 55: False}, hold_at=80)
        manager = JobManager(config, cluster=cluster, schedule=False).start()
        cluster.manager = manager
        while not done: manager.scheduler.pass_once(); cluster.autoscale()
    """

    manager: Any = None
    faults: dict[int, bool] = field(default_factory=dict)
    hold_at: int | None = None  # a step where the run waits for `go`, after setting `held`
    errors: list[BaseException] = field(default_factory=list)  # anything else a run raised

    def __post_init__(self) -> None:
        super().__post_init__()
        self.lock = threading.Lock()
        self.launched = self.bought = 0
        self.held, self.go = threading.Event(), threading.Event()

    def now(self) -> float:
        return time.time()

    def launch(self, job_id: str, spec: JobSpec, layout: Layout, checkpoint_root: str,
               run_root: str, worker_resources: dict[str, float] | None,
               notice_endpoint: str | None) -> FakeRun:
        run = super().launch(job_id, spec, layout, checkpoint_root, run_root,
                             worker_resources, notice_endpoint)
        with self.lock:
            node = next((n for n, r in self.nodes.items() if set(worker_resources or ()) & set(r)),
                        None)
        threading.Thread(target=self._train, args=(run, node, checkpoint_root), daemon=True,
                         name=f"run-{job_id}-{self.launched}").start()
        self.launched += 1
        return run

    def _train(self, run: FakeRun, node: str | None, checkpoint_root: str) -> None:
        from raytrain.train.loop import train
        from raytrain.train.rank import WorkerInfo

        sink = DirectSink(self, run, node)
        try:
            result = train(run.spec, WorkerInfo.single_process(), sink, checkpoint_root,
                           progress_interval_s=0.0, notices=sink.notices, layout=run.layout)
            if result["preempted"] and sink.notices.stop_requested and node:
                self.take(node)  # the cloud takes the noticed node back
        except NodeLost as lost:
            run.error = f"ActorDiedError: a training worker died: {lost}"
        except BaseException as unexpected:  # noqa: BLE001 - handed to the test
            self.errors.append(unexpected)
            run.error = repr(unexpected)
        run.done = True

    def take(self, node: str) -> None:
        with self.lock:
            self.nodes.pop(node, None)

    def train_to_the_end(self, config: Any, document: dict[str, Any],
                         between: Any = None, timeout_s: float = 240.0) -> Any:
        """A job manager on this cluster (`manager`) with `config` (a ServiceConfig), the job
        `document` submitted to it, and scheduling and autoscaling passes until the job ends
        (`between(job_id)` before each); the job's id."""
        from raytrain.serve.jobs.manager import JobManager
        from raytrain.spec import JobState

        self.manager = JobManager(config.model_dump(mode="json"), cluster=self,
                                  schedule=False).start()
        job_id = self.manager.submit(parse_job_spec(document)).id
        deadline = time.monotonic() + timeout_s
        while not JobState(self.manager.records[job_id].status.state).is_terminal:
            assert time.monotonic() < deadline, self.manager.records[job_id].status
            assert not self.errors, self.errors
            if between is not None:
                between(job_id)
            self.manager.scheduler.pass_once()
            self.autoscale()
            time.sleep(0.02)
        return job_id

    def autoscale(self) -> None:
        with self.lock:
            for bundles in self.requests.values():
                for kind in {key for bundle in bundles for key in bundle}:
                    wanted = sum(1 for bundle in bundles if kind in bundle)
                    have = sum(1 for r in self.nodes.values() if kind in r)
                    for _ in range(wanted - have):
                        self.bought += 1
                        self.nodes[f"{kind}-{self.bought}"] = {"CPU": 2.0, kind: 1.0}

    def total_resources(self) -> dict[str, float]:
        with self.lock:
            return super().total_resources()

    def node_resources(self) -> list[dict[str, float]]:
        with self.lock:
            return super().node_resources()

    def alive_nodes(self, with_resources: Iterable[str] = ()) -> frozenset[str]:
        with self.lock:
            return super().alive_nodes(with_resources)
