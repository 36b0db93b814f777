"""What the job manager needs of the cluster it runs on, as a `Protocol`: start a job's
runner and see it end, stop it, read nodes and resources, ask for nodes, reclaim what a lost
manager left, and read the clock. Three classes implement it:

- `serve.adaptors.ray_cluster.RayCluster`: Ray itself, in the service;
- `sim.trace_cloud.TraceCloud`: a simulated cloud on a simulated clock, for trace replays;
- `raytrain.testing.fake_ray.FakeRay` (and its `TrainingRay`): a recording fake for in-process
  tests.

Each is checked against this Protocol by the type checker (tests/support/adaptors_conform.py, in
`.ci/run`'s mypy), so an adaptor that misses a method, or takes other arguments, fails
before a test runs. The handle a launch returns is the adaptor's own type; the job manager
only hands it back.

    manager = JobManager(config, cluster=RayCluster()).start()
"""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol, TypeVar

from raytrain.spec import JobSpec, Layout

Handle = TypeVar("Handle")


class Cluster(Protocol[Handle]):
    def now(self) -> float:
        """Unix time, by the cluster's clock (a simulated one in a replay)."""
        ...

    def launch(self, job_id: str, spec: JobSpec, layout: Layout,
               checkpoint_root: str, run_root: str, worker_resources: dict[str, float] | None,
               notice_endpoint: str | None) -> Handle:
        """Start the job's runner, which trains it; returns at once. The spec and layout
        travel as the values they are (validated once, where the job came in)."""
        ...

    def finished(self, handles: Mapping[str, Handle]) -> set[str]:
        """The jobs (of `handles`) whose runner returned or raised; never waits."""
        ...

    def outcome(self, handle: Handle) -> str | None:
        """None if a finished runner returned, else its workers' error in a few lines."""
        ...

    def stop(self, handle: Handle, placement_group: str | None = None) -> None:
        """Stop the runner at once (and remove its worker group's placement group, if
        named)."""
        ...

    def total_resources(self) -> dict[str, float]:
        """Every alive node's resources, summed."""
        ...

    def node_resources(self) -> list[dict[str, float]]:
        """Each alive node's resources."""
        ...

    def alive_nodes(self, with_resources: Iterable[str] = ()) -> frozenset[str]:
        """Ids of alive nodes (those that carry one of `with_resources`, if given)."""
        ...

    def prepare_requests(self) -> None:
        """Get ready to take node requests (the scheduler thread calls it once, at start)."""
        ...

    def request_nodes(self, job_id: str, bundles: list[dict[str, float]]) -> None:
        """Ask for nodes for the job's `bundles` ([]: withdraw the job's request)."""
        ...

    def reclaim_runners(self) -> None:
        """Stop runners a lost job manager left behind."""
        ...

    def reclaim_groups(self, owned: set[str], node_types: Iterable[str]) -> None:
        """Remove training placement groups that no run in `owned` holds."""
        ...
