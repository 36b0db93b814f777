"""Type-checked, not run: each implementation of the job manager's cluster adaptor is a
`raytrain.serve.cluster.Cluster`, and the job manager is what its scheduler takes
(`raytrain.serve.scheduler.Jobs`); `.ci/run`'s mypy reads this file. Dropping a method from
one of them, or changing its arguments, is a type error here."""

from __future__ import annotations

from raytrain.serve.cluster import Cluster
from raytrain.serve.manager import JobManager
from raytrain.serve.ray_cluster import RayCluster, RunHandle
from raytrain.serve.scheduler import Jobs
from raytrain.serve.sim_workers import SimRun
from raytrain.serve.trace_cloud import TraceCloud
from tests.fake_ray import FakeRay, FakeRun, TrainingRay


def ray_conforms(cluster: RayCluster) -> Cluster[RunHandle]:
    return cluster


def trace_cloud_conforms(cluster: TraceCloud) -> Cluster[SimRun]:
    return cluster


def fake_conforms(cluster: FakeRay) -> Cluster[FakeRun]:
    return cluster


def training_fake_conforms(cluster: TrainingRay) -> Cluster[FakeRun]:
    return cluster


def manager_conforms(manager: JobManager) -> Jobs:
    return manager
