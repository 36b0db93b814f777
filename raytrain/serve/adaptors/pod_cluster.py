"""The job manager's cluster, with RunPod's interruptible pods beside it: a cluster adaptor
(raytrain.serve.adaptors.cluster.Cluster) that hands what concerns a pod type
(ServiceConfig.pod_types) to the pod fleet (raytrain.cloud.pod_runs) and everything else to
the cluster it wraps.

To the job manager a rented pod is a node like any other: it carries its node type's
resource, it is requested with the same bundles, it is alive while RunPod runs it, and a
job's run on it ends like a Ray run. So the policy, the provisioner, billing and the
lifecycle (a run that ends with its node gone is a preemption) serve these jobs unchanged,
through one plan and one bill.

    cluster = WithPods(RayCluster(), PodFleet(api, config.pod_types, key, public_key))
    manager = JobManager(config, cluster=cluster).start(); cluster.reports = manager
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, Iterable, Mapping, TypeVar

from raytrain.cloud.object_store import join, parent
from raytrain.cloud.pod_runs import PodFleet, PodRun, Reports
from raytrain.serve.adaptors.cluster import Cluster
from raytrain.spec import JobSpec, Layout, ServiceConfig

Inner = TypeVar("Inner")


class WithPods(Generic[Inner]):
    def __init__(self, inner: Cluster[Inner], fleet: PodFleet) -> None:
        self.inner, self.fleet = inner, fleet
        self.reports: Reports | None = None  # the job manager, once it exists

    def _pod_type(self, resources: Iterable[str]) -> str | None:
        return next((kind for kind in resources if kind in self.fleet.types), None)

    def now(self) -> float:
        return self.inner.now()

    def launch(self, job_id: str, spec: JobSpec, layout: Layout, checkpoint_root: str,
               run_root: str, worker_resources: dict[str, float] | None,
               notice_endpoint: str | None) -> Any:
        kind = self._pod_type(worker_resources or ())
        if kind is None:
            return self.inner.launch(job_id, spec, layout, checkpoint_root, run_root,
                                     worker_resources, notice_endpoint)
        assert self.reports is not None, "WithPods.reports is the job manager"
        return self.fleet.launch(self.reports, job_id, kind, spec, layout, checkpoint_root,
                                 join(parent(checkpoint_root), "logs"))

    def finished(self, handles: Mapping[str, Any]) -> set[str]:
        pods = {j for j, h in handles.items() if isinstance(h, PodRun)}
        return {j for j in pods if handles[j].done.is_set()} | self.inner.finished(
            {j: h for j, h in handles.items() if j not in pods})

    def outcome(self, handle: Any) -> str | None:
        return handle.error if isinstance(handle, PodRun) else self.inner.outcome(handle)

    def stop(self, handle: Any, placement_group: str | None = None) -> None:
        if isinstance(handle, PodRun):
            handle.stop()
        else:
            self.inner.stop(handle, placement_group)

    def _pods(self) -> dict[str, dict[str, float]]:
        return self.fleet.nodes()

    def total_resources(self) -> dict[str, float]:
        total = dict(self.inner.total_resources())
        for resources in self._pods().values():
            for key, amount in resources.items():
                total[key] = total.get(key, 0.0) + amount
        return total

    def node_resources(self) -> list[dict[str, float]]:
        return [*self.inner.node_resources(), *self._pods().values()]

    def alive_nodes(self, with_resources: Iterable[str] = ()) -> frozenset[str]:
        wanted = set(with_resources)
        pods = {pod_id for pod_id, resources in self._pods().items()
                if not wanted or wanted & set(resources)}
        return self.inner.alive_nodes(wanted) | pods

    def prepare_requests(self) -> None:
        self.inner.prepare_requests()

    def request_nodes(self, job_id: str, bundles: list[dict[str, float]]) -> None:
        """Bundles of a pod type rent pods; the rest go to the autoscaler ([]: withdraw
        both)."""
        pods = [b for b in bundles if self._pod_type(b)]
        rest = [b for b in bundles if not self._pod_type(b)]
        if pods:
            kind = self._pod_type(pods[0])
            assert kind is not None
            self.fleet.request(job_id, kind, len(pods))
        else:
            self.fleet.withdraw(job_id)
        if rest or not bundles:
            self.inner.request_nodes(job_id, rest)

    def reclaim_runners(self) -> None:
        self.inner.reclaim_runners()
        self.fleet.reclaim()

    def reclaim_groups(self, owned: set[str], node_types: Iterable[str]) -> None:
        self.inner.reclaim_groups(owned, [n for n in node_types if n not in self.fleet.types])


def with_pods(cluster: Cluster[Any], config: ServiceConfig, reports: Reports) -> Cluster[Any]:
    """`cluster`, with RunPod's interruptible pods beside it when the config names pod types
    (RUNPOD_API_KEY, and the config's SSH key), their runs reporting to `reports` (the job
    manager). A WithPods given as it is takes `reports` too."""
    if isinstance(cluster, WithPods):
        cluster.reports = reports
    if not config.pod_types or isinstance(cluster, WithPods):
        return cluster
    from raytrain.cloud.pod_runs import PodFleet
    from raytrain.cloud.runpod import RunPodAPI, api_key

    key = Path(config.pod_ssh_private_key).expanduser()
    fleet = PodFleet(RunPodAPI(api_key()), dict(config.pod_types), key, public_key_of(key))
    with_fleet = WithPods(cluster, fleet)
    with_fleet.reports = reports
    return with_fleet


def public_key_of(private: Path) -> str:
    """The public half of the pods' SSH key: its .pub beside it, else derived from it (`ray
    up` copies only the private key to the head)."""
    import subprocess

    from raytrain.cloud.runpod import RunPodError
    from raytrain.cloud.runpod_provider import ssh_public_key

    try:
        return ssh_public_key({"ssh_private_key": str(private)})
    except RunPodError:
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True,
                                 text=True, timeout=30)
        if derived.returncode != 0 or not derived.stdout.startswith(("ssh-", "ecdsa-")):
            raise RunPodError(f"no public key for pod_ssh_private_key {private} (ssh-keygen "
                              f"-y: {derived.stderr.strip()[:200]}). To fix: name an "
                              "unencrypted private key with its .pub beside it") from None
        return derived.stdout.strip()
