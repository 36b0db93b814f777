"""Ray's autoscaler buys RunPod pods through this node provider (`provider: type: external`,
`module: raytrain.cloud.runpod_provider.RunPodNodeProvider`; cluster/runpod.yaml).

Ray's NodeProvider interface is the contract; what RunPod lacks is written here:
- Tags live on the cloud side: a pod is created with its cluster's name and its Ray tags in
  its environment (RAYTRAIN_CLUSTER, RAYTRAIN_NODE_TAGS), so a restarted autoscaler lists its
  nodes from RunPod alone. RunPod cannot change a running pod's environment, so tags Ray sets
  later (its status) are kept beside it in a small JSON file on the head
  (`provider.tags_file`, default ~/.raytrain/runpod-tags-<cluster>.json), read back on start.
- The head is not a pod the provider bought (it runs the autoscaler), but Ray's autoscaler
  expects to find it among the provider's nodes: it is listed as node "head", of the node type
  `provider.head_node_type` (default "head"), and never terminated here.
- Pods start Ray themselves (their docker args run `ray start` against the head over
  RunPod's global networking), so the config sets `disable_node_updaters` and each node is
  up to date as created. A node's internal IP is its private address on that network.
- Nothing is left running unaccounted: a create that fails half-way (a timeout after RunPod
  may have made the pod) looks the pod up by the unique name it was given and terminates it;
  if RunPod cannot be reached for that either, the name is kept and the next listing finishes
  the job. A pod RunPod takes back (interruptible, no notice) is simply gone from the
  listing: Ray sees its node die, and the service treats it as a preemption.
- No stock, or an interruptible price above the node type's ceiling: create_node raises
  NoCapacity, the autoscaler's request stays unmet, and the service's policy moves the job to
  its next offer.

Node config per node type: gpu_type_id, gpu_count, interruptible (true: spot),
bid_per_gpu (optional: the most an interruptible GPU-hour may cost; RunPod rents at the going
price), image, cloud_type, container_disk_gb, docker_args (the shell command that installs
raytrain and starts Ray; `{head_ip}` and `{resources}` are filled in), create_input (more
fields of RunPod's REST create input, as its API reference names them, e.g.
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
    DEPLOY_INPUT_GONE,
    REST_URL,
    PodRequest,
    RunPodAPI,
    RunPodError,
    api_key,
    pod_env,
)

logger = logging.getLogger(__name__)

CLUSTER_ENV = "RAYTRAIN_CLUSTER"
TAGS_ENV = "RAYTRAIN_NODE_TAGS"
NODE_ID_ENV = "RAYTRAIN_RAY_NODE_ID"
HEAD = "head"  # the head's node id here: it is not a pod this provider bought
LIST_CACHE_S = 2.0
GONE = ("TERMINATED", "EXITED")
DEFAULT_IMAGE = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"


class RunPodNodeProvider(NodeProvider):
    def __init__(self, provider_config: dict[str, Any], cluster_name: str,
                 api: RunPodAPI | None = None) -> None:
        super().__init__(provider_config, cluster_name)
        self.api = api or RunPodAPI(api_key(), url=provider_config.get("api_url", API_URL),
                                    rest_url=provider_config.get("rest_url", REST_URL))
        self.head_ip = provider_config.get("head_ip") or _this_machines_ip()
        default_tags = f"~/.raytrain/runpod-tags-{cluster_name}.json"
        self.tags_file = Path(provider_config.get("tags_file", default_tags)).expanduser()
        self._lock = threading.RLock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._listed_at = -float("inf")
        self._later_tags: dict[str, dict[str, str]] = self._read_tags()
        self._unfinished: set[str] = set()  # names of creates that may have left a pod

    # ---------------------------------------------------------------- listing

    def _list(self, fresh: bool = False) -> dict[str, dict[str, Any]]:
        with self._lock:
            if fresh or time.monotonic() - self._listed_at > LIST_CACHE_S:
                pods = self.api.pods()
                mine = {p["id"]: p for p in pods
                        if pod_env(p).get(CLUSTER_ENV) == self.cluster_name
                        and p.get("desiredStatus") not in GONE}
                self._pods, self._listed_at = mine, time.monotonic()
                self._finish_unfinished(pods)
            return self._pods

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        nodes = [HEAD, *self._list()]
        return [node_id for node_id in nodes
                if all(self.node_tags(node_id).get(k) == v for k, v in tag_filters.items())]

    def is_running(self, node_id: str) -> bool:
        return node_id == HEAD or node_id in self._list()

    def is_terminated(self, node_id: str) -> bool:
        return not self.is_running(node_id)

    def node_tags(self, node_id: str) -> dict[str, str]:
        if node_id == HEAD:
            return {TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_NODE_STATUS: "up-to-date",
                    TAG_RAY_USER_NODE_TYPE: self.provider_config.get("head_node_type", HEAD)}
        with self._lock:
            pod = self._pods.get(node_id) or self._list(fresh=True).get(node_id)
            created = json.loads(pod_env(pod).get(TAGS_ENV, "{}")) if pod else {}
            return {**created, **self._later_tags.get(node_id, {})}

    def internal_ip(self, node_id: str) -> str:
        if node_id == HEAD:
            return str(self.provider_config.get("head_node_id") or self.head_ip) \
                if self.provider_config.get("use_node_id_as_ip") else self.head_ip
        pod = self._list().get(node_id) or {}
        if self.provider_config.get("use_node_id_as_ip"):
            return pod_env(pod).get(NODE_ID_ENV, "")
        return _ip(pod, public=False)

    def external_ip(self, node_id: str) -> str:
        return "" if node_id == HEAD else _ip(self._list().get(node_id) or {}, public=True)

    # ------------------------------------------------------------ create/remove

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, Any]:
        created: dict[str, Any] = {}
        for _ in range(count):
            request = self._request(node_config, tags)
            try:
                pod = self.api.deploy(request)
            except RunPodError:
                self._clean_up_after(request.name)
                raise
            created[pod["id"]] = pod
            logger.info("RunPod pod %s created (%s x %s, %s)", pod["id"], request.gpu_count,
                        request.gpu_type_id, "interruptible" if request.interruptible
                        else "on-demand")
        with self._lock:
            self._listed_at = -float("inf")
        return created

    def _request(self, node_config: dict[str, Any], tags: dict[str, str]) -> PodRequest:
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE, "worker")
        if "deploy_input" in node_config:
            raise RunPodError(f"node type {node_type!r}: {DEPLOY_INPUT_GONE}")
        if "gpu_type_id" not in node_config or "gpu_count" not in node_config:
            raise RunPodError(f"node type {node_type!r} names no gpu_type_id and gpu_count, so "
                              "no pod can be bought for it. To fix: add them to its node_config "
                              "(the head is not bought here)")
        # The pod starts Ray itself: it is up to date as soon as it exists.
        tags = {**tags, TAG_RAY_NODE_STATUS: "up-to-date"}
        resources = json.dumps({node_type: 1, **node_config.get("resources", {})})
        args = str(node_config.get("docker_args", "")).format(head_ip=self.head_ip,
                                                               resources=resources)
        return PodRequest(
            name=f"ray-{self.cluster_name}-{node_type}-{uuid.uuid4().hex[:8]}",
            image=node_config.get("image", DEFAULT_IMAGE),
            gpu_type_id=node_config["gpu_type_id"], gpu_count=int(node_config["gpu_count"]),
            interruptible=bool(node_config.get("interruptible", False)),
            bid_per_gpu=node_config.get("bid_per_gpu"),
            cloud_type=node_config.get("cloud_type", "SECURE"),
            container_disk_gb=int(node_config.get("container_disk_gb", 50)),
            docker_args=args, extra=dict(node_config.get("create_input", {})),
            env={**node_config.get("env", {}), CLUSTER_ENV: self.cluster_name,
                 TAGS_ENV: json.dumps(tags, sort_keys=True), "RAY_HEAD_IP": self.head_ip,
                 **self._node_id_env()})

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

    def terminate_node(self, node_id: str) -> None:
        if node_id == HEAD:
            logger.warning("not terminating the head: this provider did not buy it")
            return
        self.api.terminate(node_id)
        with self._lock:
            self._pods.pop(node_id, None)
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


def _ip(pod: dict[str, Any], public: bool) -> str:
    for port in (pod.get("runtime") or {}).get("ports") or []:
        if bool(port.get("isIpPublic")) == public and port.get("ip"):
            return str(port["ip"])
    return ""


def _this_machines_ip() -> str:
    from ray.util import get_node_ip_address

    return get_node_ip_address()
