"""Type-checked, not run: each implementation of the job manager's cluster adaptor is a
`raytrain.serve.adaptors.cluster.Cluster`, and the job manager is what its scheduler takes
(`raytrain.serve.jobs.scheduler.Jobs`); `.ci/run`'s mypy reads this file. Dropping a method from
one of them, or changing its arguments, is a type error here."""

from __future__ import annotations

from raytrain.serve.adaptors.cluster import Cluster
from raytrain.serve.adaptors.ray_cluster import RayCluster, RunHandle
from raytrain.serve.jobs.manager import JobManager
from raytrain.serve.jobs.scheduler import Jobs
from raytrain.sim.trace_cloud import TraceCloud
from raytrain.sim.workers import SimRun
from raytrain.testing.fake_ray import FakeRay, FakeRun, TrainingRay


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
