"""Ray's autoscaler buys RunPod pods through this node provider (`provider: type: external`,
`module: raytrain.cloud.runpod_provider.RunPodNodeProvider`; cluster/runpod.yaml).

Ray's NodeProvider interface is the contract; what RunPod lacks is written here:
- Tags live on the cloud side: a pod is created with its cluster's name and its Ray tags in
  its environment (RAYTRAIN_CLUSTER, RAYTRAIN_NODE_TAGS), so a restarted autoscaler lists its
  nodes from RunPod alone. RunPod cannot change a running pod's environment, so tags Ray sets
  later (its status) are kept beside it in a small JSON file on the head
  (`provider.tags_file`, default ~/.raytrain/runpod-tags-<cluster>.json), read back on start.
- The head is a pod too: `ray up` creates it (its node type's node_config, on demand, on the
  global network, `22/tcp` published), reaches it where RunPod publishes its SSH
  (`ssh.direct`: raytrain.cloud.runpod_ssh) and runs the config's setup and start commands
  there; the autoscaler on the head then buys the workers. Only the head pod is given the
  RunPod API key (in its environment, as RunPod passes any pod's: the autoscaler there needs
  it) and every
  pod the public half of `auth.ssh_private_key` (PUBLIC_KEY, which RunPod's images add to
  root's authorized keys). `ray down` terminates the workers, then the head.
- Worker pods start Ray themselves (their command runs `ray start` against the head over
  RunPod's global networking), so the config sets `disable_node_updaters` and each worker is
  up to date as created. A node's internal IP is its private address on that network.
- Every pod is on-demand. RunPod's interruptible pods exist only in its GraphQL API, whose
  create takes no global networking: such a pod cannot reach the head, so it cannot be a
  Ray node, and an `interruptible: true` node type is refused with the fix.
- The listing is cached (`provider.list_cache_s`, default LIST_CACHE_S) and read fresh only
  after a create or a terminate, so that the autoscaler's many questions per update do not
  spend RunPod's rate limit; a pod of the cluster found stopped (EXITED, ERROR) holds its
  disk and runs nothing, and is terminated.
- Nothing is left running unaccounted: a create that fails half-way (a timeout after RunPod
  may have made the pod) looks the pod up by the unique name it was given and terminates it;
  if RunPod cannot be reached for that either, the name is kept and the next listing finishes
  the job. A pod RunPod takes back (a host lost) is simply gone from the
  listing: Ray sees its node die, and the service treats it as a preemption.
- No stock: create_node raises NoCapacity, the autoscaler's request stays unmet, and the
  service's policy moves the job to its next offer. Data centers named in create_input that
  do not offer global networking are refused before anything is bought.

Node config per node type: gpu_type_id, gpu_count, interruptible (false: RunPod's are not
Ray nodes, above), ports (the pod's published ports, default ["22/tcp"]), image, cloud_type
(SECURE or COMMUNITY), container_disk_gb, docker_args (the shell command that installs
raytrain and starts Ray; `{head_ip}` and `{resources}` are filled in), create_input (more
fields of RunPod's v2 create, POST /v2/pods, as its reference names them, e.g.
`dataCenterIds`). Every pod is created on the account's global network.

With Ray's `use_node_id_as_ip` set in the provider config (every "pod" on one host, as in
the tests' fake of RunPod), each pod is given the Ray node id its node will take, and that id
stands for its address, as Ray's own fake multi-node provider does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import (
    NODE_KIND_HEAD,
    TAG_RAY_NODE_KIND,
    TAG_RAY_NODE_STATUS,
    TAG_RAY_USER_NODE_TYPE,
)

from raytrain.cloud.runpod import (
    API_URL,
    KEY_ENV,
    REST_URL,
    STOPPED,
    NoCapacity,
    PodRequest,
    RunPodAPI,
    RunPodError,
    api_key,
    node_config_problem,
    pod_env,
    pod_private_ip,
    pod_ssh,
)

logger = logging.getLogger(__name__)

CLUSTER_ENV = "RAYTRAIN_CLUSTER"
TAGS_ENV = "RAYTRAIN_NODE_TAGS"
NODE_ID_ENV = "RAYTRAIN_RAY_NODE_ID"
PUBLIC_KEY_ENV = "PUBLIC_KEY"  # RunPod's images add it to root's authorized_keys
LIST_CACHE_S = 10.0
DEFAULT_IMAGE = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"


class RunPodNodeProvider(NodeProvider):
    def __init__(self, provider_config: dict[str, Any], cluster_name: str,
                 api: RunPodAPI | None = None) -> None:
        super().__init__(provider_config, cluster_name)
        self.api = api or RunPodAPI(api_key(), url=provider_config.get("api_url", API_URL),
                                    rest_url=provider_config.get("rest_url", REST_URL))
        self._head_ip: str | None = provider_config.get("head_ip")
        default_tags = f"~/.raytrain/runpod-tags-{cluster_name}.json"
        self.tags_file = Path(provider_config.get("tags_file", default_tags)).expanduser()
        self._lock = threading.RLock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._listed_at = -float("inf")
        self.list_cache_s = float(provider_config.get("list_cache_s", LIST_CACHE_S))
        self._later_tags: dict[str, dict[str, str]] = self._read_tags()
        self._unfinished: set[str] = set()  # names of creates that may have left a pod

    # ---------------------------------------------------------------- listing

    def _list(self, fresh: bool = False) -> dict[str, dict[str, Any]]:
        with self._lock:
            if fresh or time.monotonic() - self._listed_at > self.list_cache_s:
                pods = self.api.pods()
                ours = [p for p in pods if pod_env(p).get(CLUSTER_ENV) == self.cluster_name]
                self._pods = {p["id"]: p for p in ours if p.get("status") not in STOPPED}
                self._listed_at = time.monotonic()
                self._finish_unfinished(pods)
                self._end_stopped([p for p in ours if p.get("status") in ("EXITED", "ERROR")])
            return self._pods

    @property
    def head_ip(self) -> str:
        """The head's address, for the workers' `ray start` (this machine: the provider that
        buys workers runs in the head's autoscaler)."""
        if self._head_ip is None:
            self._head_ip = _this_machines_ip()
        return self._head_ip

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        return [node_id for node_id in self._list()
                if all(self.node_tags(node_id).get(k) == v for k, v in tag_filters.items())]

    def is_running(self, node_id: str) -> bool:
        return node_id in self._list()

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        with self._lock:
            pod = self._pods.get(node_id) or self._list(fresh=True).get(node_id)
            created = json.loads(pod_env(pod).get(TAGS_ENV, "{}")) if pod else {}
            return {**created, **self._later_tags.get(node_id, {})}

    def internal_ip(self, node_id: str) -> str:
        pod = self._list().get(node_id) or {}
        if self.provider_config.get("use_node_id_as_ip"):
            return pod_env(pod).get(NODE_ID_ENV, "")
        return pod_private_ip(pod)

    def external_ip(self, node_id: str) -> str:
        address = pod_ssh(self._list().get(node_id) or {})
        return address[0] if address else ""

    def ssh_address(self, node_id: str, public: bool) -> tuple[str, int] | None:
        """Where the pod's SSH answers: `ssh.direct` (its public address and the port RunPod
        publishes its 22/tcp on), or its private address and port 22; None until RunPod
        says (while the pod boots)."""
        pod = self._list(fresh=True).get(node_id) or {}
        if public:
            return pod_ssh(pod)
        private = pod_private_ip(pod)
        return (private, 22) if private else None

    def get_command_runner(self, log_prefix: str, node_id: str, auth_config: dict[str, Any],
                           cluster_name: str, process_runner: Any, use_internal_ip: bool,
                           docker_config: dict[str, Any] | None = None) -> Any:
        """Ray's SSH runner on the pod's mapped port (raytrain.cloud.runpod_ssh); a pod is
        itself a container, so Ray's docker settings do not apply."""
        from raytrain.cloud.runpod_ssh import RunPodCommandRunner

        if docker_config and docker_config.get("container_name"):
            raise RunPodError("the cluster config has a docker section, but a RunPod pod is "
                              "already a container. To fix: remove `docker` and name the "
                              "image in each node type's node_config (image)")
        return RunPodCommandRunner(log_prefix=log_prefix, node_id=node_id, provider=self,
                                   auth_config=auth_config, cluster_name=cluster_name,
                                   process_runner=process_runner,
                                   use_internal_ip=use_internal_ip)

    @staticmethod
    def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
        """For `ray up`: the SSH key pair's public half, for every pod's PUBLIC_KEY."""
        config = dict(cluster_config)
        config["provider"] = {**config["provider"],
                              "ssh_public_key": ssh_public_key(config.get("auth") or {})}
        return config

    # ------------------------------------------------------------ create/remove

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, Any]:
        created: dict[str, Any] = {}
        for _ in range(count):
            request = self._request(node_config, tags)
            try:
                pod = self.api.create(request)
            except NoCapacity as exc:
                self._clean_up_after(request.name)
                if tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:  # nothing to move to
                    raise NoCapacity(
                        f"RunPod has no {request.gpu_type_id} for the head pod now. To fix: "
                        "name another small NVIDIA GPU in the head node type's gpu_type_id "
                        "(the head trains nothing; any GPU pod can join the global network), "
                        f"or run `ray up` again later ({exc})") from None
                raise
            except RunPodError:
                self._clean_up_after(request.name)
                raise
            created[pod["id"]] = pod
            logger.info("RunPod pod %s created (%s x %s, on-demand)", pod["id"],
                        request.gpu_count, request.gpu_type_id)
        with self._lock:
            self._listed_at = -float("inf")
        return created

    def _request(self, node_config: dict[str, Any], tags: dict[str, str]) -> PodRequest:
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE, "worker")
        head = tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD
        problem = node_config_problem(node_config)
        if problem:
            raise RunPodError(f"node type {node_type!r}: {problem}")
        if "gpu_type_id" not in node_config or "gpu_count" not in node_config:
            raise RunPodError(f"node type {node_type!r} names no gpu_type_id and gpu_count, so "
                              "no pod can be bought for it. To fix: add them to its node_config "
                              "(RunPod's global network, which the pods share, takes NVIDIA GPU "
                              "pods only: the head too)")
        env = {**node_config.get("env", {}), CLUSTER_ENV: self.cluster_name}
        if self.provider_config.get("ssh_public_key"):
            env[PUBLIC_KEY_ENV] = self.provider_config["ssh_public_key"]
        if head:  # its autoscaler buys the workers; `ray up` runs its start commands
            env[KEY_ENV] = self.api.key
            args = ""
        else:  # the pod starts Ray itself: it is up to date as soon as it exists
            tags = {**tags, TAG_RAY_NODE_STATUS: "up-to-date"}
            resources = json.dumps({node_type: 1, **node_config.get("resources", {})})
            args = str(node_config.get("docker_args", "")).format(head_ip=self.head_ip,
                                                                   resources=resources)
            env["RAY_HEAD_IP"] = self.head_ip
        extra = dict(node_config.get("create_input", {}))
        self._check_data_centers(node_type, extra.get("dataCenterIds"))
        return PodRequest(
            name=f"ray-{self.cluster_name}-{node_type}-{uuid.uuid4().hex[:8]}",
            image=node_config.get("image", DEFAULT_IMAGE),
            gpu_type_id=node_config["gpu_type_id"], gpu_count=int(node_config["gpu_count"]),
            cloud=node_config.get("cloud_type", "SECURE"),
            disk_gb=int(node_config.get("container_disk_gb", 50)),
            command=args, extra=extra, ports=tuple(node_config.get("ports", ("22/tcp",))),
            env={**env, TAGS_ENV: json.dumps(tags, sort_keys=True), **self._node_id_env()})

    def _check_data_centers(self, node_type: str, wanted: Any) -> None:
        """Data centers named for a pod must offer global networking (GET
        /v2/catalog/datacenters), or the pod could never reach the head: refused before
        anything is bought, naming those that do."""
        if not wanted:
            return
        centers = {d.get("id"): bool(d.get("globalNetwork")) for d in self.api.data_centers()}
        bad = [c for c in wanted if not centers.get(c)]
        if bad:
            good = sorted(str(c) for c, network in centers.items() if network)
            raise RunPodError(
                f"node type {node_type!r}: data centers {', '.join(map(str, bad))} in "
                "create_input.dataCenterIds do not offer RunPod's global network (or do not "
                "exist), which the pods reach the head over. To fix: list only some of "
                f"{', '.join(good)}, or leave dataCenterIds out")

    def _node_id_env(self) -> dict[str, str]:
        if not self.provider_config.get("use_node_id_as_ip"):
            return {}
        node_id = uuid.uuid4().hex + uuid.uuid4().hex[:24]  # a Ray NodeID: 28 bytes
        return {NODE_ID_ENV: node_id, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id}

    def _clean_up_after(self, name: str) -> None:
        """A create failed: RunPod may still have made the pod. Terminate it, now or at the
        next listing."""
        with self._lock:
            self._unfinished.add(name)
            try:
                self._finish_unfinished(self.api.pods())
            except RunPodError as exc:
                logger.warning("RunPod cannot be asked whether pod %s exists (%s); the next "
                               "listing terminates it if it does", name, exc)

    def _end_stopped(self, pods: list[dict[str, Any]]) -> None:
        """Terminate pods of this cluster that stopped (their container exited or failed):
        they run no Ray node and would keep their disk, billed, until someone noticed."""
        for pod in pods:
            try:
                self.api.terminate(pod["id"])
                logger.warning("RunPod pod %s of cluster %s was %s: terminated", pod["id"],
                               self.cluster_name, pod.get("status"))
            except RunPodError as exc:
                logger.warning("RunPod pod %s is %s and not terminated yet (%s); the next "
                               "listing tries again", pod["id"], pod.get("status"), exc)

    def _finish_unfinished(self, pods: list[dict[str, Any]]) -> None:
        """Terminate the pods of failed creates; a name whose pod RunPod would not terminate
        now stays for the next listing (which must not fail for it)."""
        for name in list(self._unfinished):
            try:
                for pod in (p for p in pods if p.get("name") == name):
                    self.api.terminate(pod["id"])
                    self._pods.pop(pod["id"], None)
                    logger.warning("RunPod pod %s from a failed create terminated", pod["id"])
            except RunPodError as exc:
                logger.warning("RunPod pod %s from a failed create is not terminated yet "
                               "(%s); the next listing tries again", name, exc)
                continue
            self._unfinished.discard(name)

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self._lock:
            self._later_tags.setdefault(node_id, {}).update(tags)
            self._write_tags()

    def terminate_nodes(self, node_ids: list[str]) -> None:
        """Workers first, the head last (`ray down` asks for them all at once)."""
        heads = set(self.non_terminated_nodes({TAG_RAY_NODE_KIND: NODE_KIND_HEAD}))
        for node_id in sorted(node_ids, key=lambda n: n in heads):
            self.terminate_node(node_id)

    def terminate_node(self, node_id: str) -> None:
        self.api.terminate(node_id)
        with self._lock:
            self._pods.pop(node_id, None)
            self._listed_at = -float("inf")
            self._later_tags.pop(node_id, None)
            self._write_tags()
        logger.info("RunPod pod %s terminated", node_id)

    # --------------------------------------------------------------- tag file

    def _read_tags(self) -> dict[str, dict[str, str]]:
        try:
            return json.loads(self.tags_file.read_text())
        except (OSError, ValueError):
            return {}

    def _write_tags(self) -> None:
        self.tags_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.tags_file.with_suffix(".partial")
        partial.write_text(json.dumps(self._later_tags, sort_keys=True))
        partial.replace(self.tags_file)


def ssh_public_key(auth: dict[str, Any]) -> str:
    """The public half of `auth.ssh_private_key` (its `.pub` beside it, or
    `auth.ssh_public_key`): what `ray up` needs to reach the pods, checked before any pod is
    bought."""
    if not auth.get("ssh_private_key"):
        raise RunPodError("the cluster config names no SSH key: `ray up` reaches the head pod "
                          "over SSH with it. To fix: set auth.ssh_private_key to a private key "
                          "(ssh-keygen -t ed25519 -f ~/.ssh/raytrain) whose .pub is beside it")
    private = Path(str(auth["ssh_private_key"])).expanduser()
    public = Path(str(auth.get("ssh_public_key") or f"{private}.pub")).expanduser()
    if not private.is_file():
        raise RunPodError(f"auth.ssh_private_key {private} does not exist. To fix: create it "
                          f"(ssh-keygen -t ed25519 -f {private}) or name an existing key")
    try:
        key = public.read_text().strip()
    except OSError:
        key = ""
    if not key.startswith(("ssh-", "ecdsa-", "sk-")):
        raise RunPodError(f"no public key for auth.ssh_private_key at {public}: RunPod adds "
                          "it to the pods' authorized keys. To fix: ssh-keygen -y -f "
                          f"{private} > {public} (or set auth.ssh_public_key)")
    return key


def _this_machines_ip() -> str:
    from ray.util import get_node_ip_address

    return get_node_ip_address()
