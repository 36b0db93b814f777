"""Everything the job manager does to Ray, behind one small adaptor: start a job's runner,
see which runners returned and how, stop one, read the cluster's nodes and resources, ask
the autoscaler for nodes, and reclaim what a lost manager's runs left behind.

`RayCluster` implements the job manager's adaptor, the Protocol
serve.adaptors.cluster.Cluster (tests pass a recording fake of it, raytrain/testing/fake_ray.py);
the manager never calls Ray itself, so its bookkeeping is tested in-process and only this
module needs a real cluster.

    cluster = RayCluster()
    handle = cluster.launch(job_id, spec, layout, ckpt_root, run_root,
                            {"gpu-node": 0.125}, None)
    cluster.finished({job_id: handle})  -> {job_id} once fit() returned
    cluster.outcome(handle)             -> None, or the workers' error in a few lines
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import ray
from ray import PlacementGroupID
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, remove_placement_group

from raytrain.errors import RaytrainError
from raytrain.spec import JobSpec, Layout

logger = logging.getLogger(__name__)

NAMESPACE = "raytrain"
MANAGER_NAME = "raytrain-job-manager"
RUNNER_PREFIX = "raytrain-job-"  # + the job's id: one runner actor per running job
HEAD_NODE_RESOURCE = "node:__internal_head__"
# Resources a training worker group's placement group may hold; one holding anything else is
# not a training run's (see reclaim_groups).
WORKER_RESOURCE_KEYS = frozenset({"CPU", "GPU", "memory"})


@ray.remote(num_cpus=0)
class JobRunner:
    """Runs one job's `fit()`; killing this actor stops the job."""

    def run(
        self, spec: JobSpec, layout: Layout, job_id: str, checkpoint_root: str, run_root: str,
        worker_resources: dict[str, float] | None = None,
        interruption_endpoint: str | None = None,
    ) -> None:
        from raytrain.train.runs import run_training_job

        run_training_job(
            spec,
            layout,
            job_id,
            checkpoint_root,
            Path(run_root),
            (NAMESPACE, MANAGER_NAME),
            worker_resources or {},
            interruption_endpoint,
        )


def storage_env() -> dict[str, Any] | None:
    """The S3 endpoint the service was given, for a run's processes (never credentials:
    every node has its own, from the standard AWS chain)."""
    env = {key: os.environ[key] for key in STORAGE_ENV if os.environ.get(key)}
    return {"env_vars": env} if env else None


STORAGE_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


@dataclass(frozen=True)
class RunHandle:
    runner: ActorHandle
    done: ray.ObjectRef


class RayCluster:
    """The job manager's effects on the Ray cluster it runs in."""

    def now(self) -> float:
        return time.time()

    def launch(self, job_id: str, spec: JobSpec, layout: Layout, checkpoint_root: str,
               run_root: str, worker_resources: dict[str, float] | None,
               notice_endpoint: str | None) -> RunHandle:
        # On the head node: Ray Train puts its controller (and Ray Data its detached
        # autoscaling coordinator) beside the caller, and a bought node that keeps any actor
        # is never idle, so the autoscaler would never let it go.
        runner = JobRunner.options(name=f"{RUNNER_PREFIX}{job_id}", namespace=NAMESPACE,
                                   resources={HEAD_NODE_RESOURCE: 0.001},
                                   runtime_env=storage_env()).remote()
        done = runner.run.remote(spec, layout, job_id, checkpoint_root, run_root,
                                 worker_resources, notice_endpoint)
        return RunHandle(runner, done)

    def finished(self, handles: Mapping[str, RunHandle]) -> set[str]:
        """The jobs whose runner returned (or raised)."""
        refs = {handle.done: job_id for job_id, handle in handles.items()}
        if not refs:
            return set()
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        return {refs[ref] for ref in ready}

    def outcome(self, handle: RunHandle) -> str | None:
        """None if the runner returned, else what its workers raised, in a few lines."""
        try:
            ray.get(handle.done)
            return None
        except Exception as exc:  # noqa: BLE001 - the worker's error, wrapped by Ray
            return describe_failure(exc)

    def stop(self, handle: RunHandle, placement_group: str | None = None) -> None:
        """Kill the runner (Ray's ownership takes the Train controller and workers with it)
        and remove the worker group's placement group if named, which Ray would otherwise
        free only through its dashboard-backed cleaner."""
        ray.kill(handle.runner, no_restart=True)
        if placement_group:
            remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(placement_group)))

    def total_resources(self) -> dict[str, float]:
        return {k: float(v) for k, v in ray.cluster_resources().items()}

    def node_resources(self) -> list[dict[str, float]]:
        """Each alive node's resources."""
        return [node["Resources"] for node in ray.nodes() if node["Alive"]]

    def alive_nodes(self, with_resources: Iterable[str] = ()) -> frozenset[str]:
        """Ids of alive nodes (that carry one of `with_resources`, if given)."""
        wanted = set(with_resources)
        return frozenset(node["NodeID"] for node in ray.nodes() if node["Alive"] and (
            not wanted or wanted & set(node["Resources"])))

    def prepare_requests(self) -> None:
        """Start what `request_nodes` asks through now, not at the first job's request: on a
        small head its start delayed the first purchase by 20-40 s."""
        coordinator()

    def request_nodes(self, job_id: str, bundles: list[dict[str, float]]) -> None:
        """Ask Ray's autoscaling coordinator for `bundles` for the job ([] withdraws)."""
        coordinator_request(job_id, bundles)

    def reclaim_runners(self) -> None:
        """Kill runner actors a lost manager left (by name): they report to no one."""
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            if entry["namespace"] != NAMESPACE or not name.startswith(RUNNER_PREFIX) \
                    or name == MANAGER_NAME:
                continue
            try:
                ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                logger.warning("reclaimed %s, left by a run this manager does not own", name)
            except ValueError:  # gone meanwhile
                pass

    def reclaim_groups(self, owned: set[str], node_types: Iterable[str]) -> None:
        """Remove training placement groups (only worker resources, or the node types' own)
        that no run in `owned` holds."""
        allowed = WORKER_RESOURCE_KEYS | set(node_types)
        for group_id, group in ray.util.placement_group_table().items():
            if group["state"] == "REMOVED" or group_id in owned:
                continue
            keys = {key for bundle in group["bundles"].values() for key in bundle}
            if keys and keys <= allowed:
                remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(group_id)))
                logger.warning("reclaimed placement group %s (%s), held by no run of this "
                               "service", group_id, group["bundles"])


REQUEST_EXPIRE_S = 180.0  # as Ray Train's own requests


# Ray's autoscaling coordinator is private (ray.data._internal) and the one private Ray API
# the service must use: Ray's public `ray.autoscaler.sdk.request_resources` keeps one request
# for the whole cluster, which each caller overwrites, and Ray Train's elastic scaling and Ray
# Data send theirs through this coordinator, which merges every requester's with an expiry.
# Asking around it would cancel theirs, and theirs ours. tests/service/test_ray_private.py
# fails when Ray changes what is used here.
def coordinator() -> Any:
    """Ray's autoscaling coordinator actor, started if it is not running (without waiting
    for it: its process imports Ray Data, 10-40 s on a small head node)."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    return get_or_create_autoscaling_coordinator()


def coordinator_request(job_id: str, bundles: list[dict[str, float]]) -> None:
    """Ask Ray's autoscaling coordinator for `bundles` for the job ([] withdraws)."""
    from ray.data._internal.cluster_autoscaler.base_autoscaling_coordinator import (
        ResourceRequestPriority,
    )

    requester = f"raytrain-job-{job_id}"
    if bundles:
        coordinator().request_resources.remote(
            requester_id=requester, resources=bundles, expire_after_s=REQUEST_EXPIRE_S,
            priority=ResourceRequestPriority.HIGH)
    else:
        coordinator().cancel_request.remote(requester)


def describe_failure(exc: BaseException) -> str:
    """The root cause of a failed fit: a raytrain error's own message when a worker raised one
    (it says how to fix it), else the last lines of the worker's error, not Ray's whole
    traceback."""
    root = _root_cause(exc)
    if isinstance(root, RaytrainError):
        return str(root)[:2000]
    text = str(root).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    tail = "\n".join(lines[-6:]) if lines else type(root).__name__
    return f"training failed: {tail}"[:2000]


def _root_cause(exc: BaseException) -> BaseException:
    """Unwrap Ray's task error and Ray Train's worker-group error down to what a rank raised
    (the lowest rank's, when several did)."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        failures = getattr(exc, "worker_failures", None)
        if isinstance(failures, dict) and failures:
            exc = failures[min(failures)]
            continue
        cause = getattr(exc, "cause", None) or getattr(exc, "controller_failure", None)
        if isinstance(cause, BaseException):
            exc = cause
            continue
        break
    return exc
