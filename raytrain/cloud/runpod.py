"""The only code that talks to RunPod, through the APIs RunPod serves today (checked against
its OpenAPI document and reference pages, docs.runpod.io/api-reference-v2, on 2026-12-06):

- REST API v2, `https://api.runpod.io/v2` (generally available since 2026-08-18; REST API
  v1, which raytrain called before, stopped serving on 2026-11-15 with 410 Gone, RunPod's
  pages also naming December 1): `POST /v2/pods` (create), `GET /v2/pods` (list; one
  `{"pods": [...]}` answer, no paging in the document), `GET` and `DELETE /v2/pods/{id}`,
  `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N` (on-demand prices per
  cloud, stock) and `GET /v2/catalog/datacenters` (which offer global networking).
- GraphQL, `https://api.runpod.io/graphql` (deprecated, rate-limited in stages since
  2026-09-17, to stop serving "in early 2027"), only for what v2 lacks: interruptible (spot)
  pods, `podRentInterruptable(input: {bidPerGpu, ...})`, and their price, `gpuTypes {
  lowestPrice(input: {gpuCount}) { minimumBidPrice } }`. v2 has neither (its OpenAPI
  document names neither, and no version of it ever has). `podRentInterruptable` takes no
  global networking, so an interruptible pod cannot reach the head on RunPod's private
  network and cannot be a Ray node: the node provider refuses interruptible node types, the
  offers say that RunPod's spot market takes no cluster job (Offer.spot_joins_cluster), and
  a one-pod job runs on such a pod driven over its public SSH (raytrain.cloud.pod_runs).
  When GraphQL is retired, that market goes with it; nothing else here does.
Variables carry every GraphQL value, so no input is ever spliced into a query. Requests go
through raytrain.cloud.runpod_http (the key as a bearer header, problem documents, rate
limits, 410 Gone).

Errors say what failed and how to fix it, and never include the key:
- `RunPodAuthError`: the key was refused (401, 403);
- `NoCapacity`: no machine has the GPU type in stock (the create's 400, or a catalog
  availability of NONE): the autoscaler's request is not met, the policy moves on;
- `RunPodUnavailable`: a timeout, no connection, a 5xx, or 429s past the retries;
- `RunPodRetired`: a 410 Gone; `RunPodError` for the rest (402: no balance; 422: a create
  field RunPod refuses; an answer in a shape v2 does not document).

    api = RunPodAPI(api_key())                       # RUNPOD_API_KEY, or a key file
    api.gpus(count=2); api.create(PodRequest(...)); api.pods(); api.terminate(pod_id)
    (prices into the offer catalog: raytrain.cloud.runpod_offers.refresh)
"""

from __future__ import annotations

import logging
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytrain.cloud.runpod_http import (
    KEY_ENV,
    KEY_FILE_ENV,
    NoCapacity,
    RunPodAuthError,
    RunPodError,
    RunPodHTTP,
    RunPodRetired,
    RunPodUnavailable,
    auth_error,
    problem_text,
)

logger = logging.getLogger(__name__)

__all__ = ["KEY_ENV", "InterruptibleRequest", "NoCapacity", "PodRequest", "RunPodAPI",
           "RunPodAuthError",
           "RunPodError", "RunPodRetired", "RunPodUnavailable", "api_key"]

REST_URL = "https://api.runpod.io/v2"
API_URL = "https://api.runpod.io/graphql"  # GraphQL: spot prices only
REST_API = "REST API v2"
GRAPHQL_API = "GraphQL API (to be retired in early 2027)"
# runpodctl and the runpod SDK keep the key here (`apikey = "..."`).
DEFAULT_KEY_FILE = Path("~/.runpod/config.toml")
TIMEOUT_S = 30.0
# What the catalog calls the GPU types RunPod names (v2's GpuType ids).
GPU_KINDS = {"NVIDIA GeForce RTX 4090": "rtx4090", "NVIDIA H100 80GB HBM3": "h100-sxm"}
INTRA_LINKS = {"rtx4090": "pcie4-no-p2p", "h100-sxm": "nvlink4"}
# Pods reach each other only over RunPod's global networking, at 100 Mbit/s: enough for Ray's
# control plane, far too slow for gradients. Each offer is one pod (max_nodes 1).
POD_NETWORK_GBPS = 0.1
# A pod in these states runs nothing (stopped, failed, gone); the node provider ends it.
STOPPED = ("EXITED", "ERROR", "TERMINATED")

# A node_config key of the GraphQL deploy, refused by the cluster checks and the provider.
DEPLOY_INPUT_GONE = ("deploy_input held the GraphQL deploy's fields; pods are created through "
                     "RunPod's REST API v2 now. To fix: rename it create_input and use v2's "
                     "field names (POST /v2/pods: image, disk, dataCenterIds, ...)")

_NO_STOCK = re.compile(r"no longer any instances available|not enough|out of stock|"
                       r"no (gpu|machine|instance)s? (are )?available|capacity", re.I)
_NO_GLOBAL_NETWORK = re.compile(r"global network", re.I)


def api_key(environ: dict[str, str] | None = None) -> str:
    """The key from RUNPOD_API_KEY, else the file RUNPOD_API_KEY_FILE names, else
    ~/.runpod/config.toml; RunPodAuthError naming where it looked when none has one."""
    environ = dict(os.environ if environ is None else environ)
    if environ.get(KEY_ENV, "").strip():
        return environ[KEY_ENV].strip()
    path = Path(environ.get(KEY_FILE_ENV) or DEFAULT_KEY_FILE).expanduser()
    try:
        text = path.read_text()
    except OSError:
        text = ""
    found = re.search(r'^\s*api_?key\s*=\s*"([^"]+)"', text, re.M | re.I)
    if found:
        return found.group(1)
    if text.strip() and "=" not in text:
        return text.strip()  # a file holding only the key
    raise RunPodAuthError(f"no RunPod API key: {KEY_ENV} is unset and {path} has none. To fix: "
                          f"export {KEY_ENV}=<key> (RunPod console, Settings, API Keys) or put "
                          f"it in a file and set {KEY_FILE_ENV}")


RENT_INTERRUPTIBLE = """
mutation RentInterruptible($input: PodRentInterruptableInput!) {
  podRentInterruptable(input: $input) { id name desiredStatus costPerHr }
}"""
SPOT_PRICES = """
query SpotPrices($count: Int!) {
  gpuTypes { id lowestPrice(input: {gpuCount: $count}) { minimumBidPrice } }
}"""


@dataclass
class PodShape:
    """What every pod asked of RunPod is: its name, image and GPUs."""

    name: str
    image: str
    gpu_type_id: str
    gpu_count: int


@dataclass
class PodRequest(PodShape):
    """One on-demand pod to create on the account's global network (a Ray node)."""

    env: dict[str, str] = field(default_factory=dict)
    cloud: str = "SECURE"
    disk_gb: int = 50
    command: str = ""  # a shell command the container runs (bash -c)
    ports: tuple[str, ...] = ("22/tcp",)
    extra: dict[str, Any] = field(default_factory=dict)  # more create fields, as v2 names them

    def body(self) -> dict[str, Any]:
        """v2's CreatePodRequest."""
        body: dict[str, Any] = {
            "name": self.name, "image": self.image,
            "gpu": {"id": self.gpu_type_id, "count": self.gpu_count},
            "cloud": self.cloud, "disk": self.disk_gb, "ports": list(self.ports),
            "env": dict(sorted(self.env.items())), "globalNetworking": True,
        }
        if self.command:
            body["args"] = shlex.join(["bash", "-c", self.command])
        return {**body, **self.extra}


@dataclass
class InterruptibleRequest(PodShape):
    """One interruptible pod to rent: reached over its public SSH only (22/tcp)."""

    bid_per_gpu: float
    env: dict[str, str] = field(default_factory=dict)
    cloud: str = "SECURE"
    disk_gb: int = 50

    def input(self) -> dict[str, Any]:
        """GraphQL's PodRentInterruptableInput (as runpod-python and SkyPilot send it)."""
        return {"name": self.name, "imageName": self.image, "gpuTypeId": self.gpu_type_id,
                "gpuCount": self.gpu_count, "bidPerGpu": self.bid_per_gpu,
                "cloudType": self.cloud, "containerDiskInGb": self.disk_gb, "volumeInGb": 0,
                "ports": "22/tcp", "startSsh": True,
                "env": [{"key": k, "value": v} for k, v in sorted(self.env.items())]}


class RunPodAPI:
    def __init__(self, key: str, url: str = API_URL, rest_url: str = REST_URL,
                 timeout_s: float = TIMEOUT_S) -> None:
        self._http = RunPodHTTP(key, timeout_s)
        self.url, self.rest_url, self.timeout_s = url, rest_url.rstrip("/"), timeout_s
        self._key = key

    @property
    def key(self) -> str:
        """The key itself: for the head pod's environment (its autoscaler buys the workers),
        never for a log."""
        return self._key

    def __repr__(self) -> str:  # never the key
        return f"RunPodAPI({self.rest_url!r}, {self.url!r})"

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ REST v2

    def _rest(self, method: str, path: str, what: str, changes: str = "nothing was changed",
              **kwargs: Any) -> Any:
        """A v2 call's JSON answer (None for 204 and 404); the errors above for the rest."""
        answer = self._http.request(method, f"{self.rest_url}{path}", what, REST_API,
                                    changes, **kwargs)
        if answer.status_code in (204, 404):
            return None
        if answer.status_code >= 400:
            _raise_refusal(what, problem_text(answer), answer.status_code)
        try:
            return answer.json()
        except ValueError:
            raise RunPodError(f"RunPod's {REST_API} answered {what} with {answer.status_code} "
                              "and no JSON. To fix: retry later; if it persists, upgrade "
                              "raytrain") from None

    def gpus(self, count: int = 1) -> list[dict[str, Any]]:
        """v2's GPU types with their on-demand prices and pod availability for `count`."""
        document = self._rest("GET", "/catalog/gpus", f"list GPU types ({count} per pod)",
                              params={"include": "AVAILABILITY", "product": "POD",
                                      "count": count})
        return _listed(document, "gpus", "list GPU types")

    def data_centers(self) -> list[dict[str, Any]]:
        return _listed(self._rest("GET", "/catalog/datacenters", "list data centers"),
                       "dataCenters", "list data centers")

    def create(self, request: PodRequest) -> dict[str, Any]:
        """Create an on-demand pod; NoCapacity when none can be had."""
        what = f"create pod ({request.gpu_count} x {request.gpu_type_id})"
        pod = self._rest("POST", "/pods", what, json=request.body(),
                         changes="the pod, if made, is found by its name and terminated")
        if not isinstance(pod, dict) or not pod.get("id"):
            raise RunPodError(f"RunPod's {REST_API} answered {what} with no pod id. To fix: "
                              "retry; if it persists, upgrade raytrain")
        return pod

    def pods(self) -> list[dict[str, Any]]:
        return _listed(self._rest("GET", "/pods", "list pods"), "pods", "list pods")

    def terminate(self, pod_id: str) -> None:
        """Terminate a pod (one already gone is no error)."""
        self._rest("DELETE", f"/pods/{pod_id}", f"terminate pod {pod_id}",
                   changes="the pod may still run: the next listing terminates it")

    # ------------------------------------------------------------------ GraphQL

    def _graphql(self, query: str, variables: dict[str, Any], what: str) -> dict[str, Any]:
        """The `data` of one GraphQL request; the errors above for anything else."""
        answer = self._http.request("POST", self.url, what, GRAPHQL_API,
                                    json={"query": query, "variables": variables})
        if answer.status_code >= 500:
            raise RunPodUnavailable(f"RunPod answered {answer.status_code} to {what}. To fix: "
                                    "retry later (RunPod's side)")
        try:
            document = answer.json()
        except ValueError:
            raise RunPodUnavailable(f"RunPod answered {what} with {answer.status_code} and no "
                                    "JSON. To fix: retry later") from None
        errors = document.get("errors") or []
        if errors:
            message = "; ".join(str(e.get("message", e)) for e in errors)[:300]
            if any((e.get("extensions") or {}).get("code") == "UNAUTHENTICATED"
                   for e in errors):
                raise auth_error()
            if _NO_STOCK.search(message):
                raise NoCapacity(f"RunPod has no machine for {what} now: {message}. To fix: "
                                 "nothing; the policy tries the next offer")
            raise RunPodError(f"RunPod's {GRAPHQL_API} refused {what}: {message}")
        if not isinstance(document.get("data"), dict):
            raise RunPodError(f"RunPod's {GRAPHQL_API} answered {what} with no data. To fix: "
                              "retry later; if it persists, upgrade raytrain")
        return document["data"]

    def rent_interruptible(self, request: InterruptibleRequest) -> dict[str, Any]:
        """Rent an interruptible pod at `request.bid_per_gpu` (GraphQL: v2 has none). It has
        no private network to other pods: the service drives it over its public SSH
        (raytrain.cloud.pod_runs)."""
        what = f"rent interruptible pod ({request.gpu_count} x {request.gpu_type_id})"
        pod = self._graphql(RENT_INTERRUPTIBLE, {"input": request.input()},
                            what).get("podRentInterruptable")
        if not isinstance(pod, dict) or not pod.get("id"):
            raise NoCapacity(f"RunPod rented no pod for {what} (no machine at that price). "
                             "To fix: nothing; the policy tries the next offer")
        return pod

    def spot_prices(self, count: int = 1) -> dict[str, float | None]:
        """The interruptible price per GPU-hour of each GPU type for pods of `count` GPUs (None:
        none to be had now), from GraphQL: v2 has no spot prices."""
        what = "read interruptible prices"
        types = self._graphql(SPOT_PRICES, {"count": count}, what).get("gpuTypes")
        if not isinstance(types, list):
            raise RunPodError(f"RunPod's {GRAPHQL_API} answered {what} with no gpuTypes. To "
                              "fix: retry later; if it persists, upgrade raytrain")
        return {str(g.get("id")): positive((g.get("lowestPrice") or {}).get("minimumBidPrice"))
                for g in types if isinstance(g, dict)}


def positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _listed(document: Any, key: str, what: str) -> list[dict[str, Any]]:
    """The list under `key` of a v2 answer; RunPodError for an answer v2 does not document."""
    if not isinstance(document, dict) or not isinstance(document.get(key), list):
        raise RunPodError(f"RunPod's {REST_API} answered {what} with a body raytrain cannot read "
                          f"(no {key!r} list). To fix: upgrade raytrain, or retry if RunPod's "
                          "side was changing")
    return [item for item in document[key] if isinstance(item, dict)]


def _raise_refusal(what: str, message: str, status: int) -> None:
    """RunPod refused `what` with `message` at HTTP `status` (a v2 problem document)."""
    if status == 400 and _NO_STOCK.search(message):
        raise NoCapacity(f"RunPod has no machine for {what} now: {message}. To fix: nothing; "
                         "the policy tries the next offer")
    if _NO_GLOBAL_NETWORK.search(message):
        raise RunPodError(f"RunPod refused {what}: {message}. The pods reach each other only "
                          "over RunPod's global network. To fix: list only data centers that "
                          "offer it (GET /v2/catalog/datacenters, globalNetwork) in the node "
                          "type's create_input.dataCenterIds, or leave it out")
    if status == 402:
        raise RunPodError(f"RunPod refused {what}: the account's balance is too low "
                          f"({message}). To fix: add funds in RunPod's console, Billing")
    if status == 422:
        raise RunPodError(f"RunPod refused a field of {what}: {message}. To fix: name only "
                          "fields of v2's create (POST /v2/pods) in the node type's "
                          "create_input")
    if status >= 500:
        raise RunPodUnavailable(f"RunPod answered {status} to {what}: {message}. To fix: retry "
                                "later (RunPod's side)")
    raise RunPodError(f"RunPod refused {what} ({status}): {message}")


def node_config_problem(node_config: dict[str, Any]) -> str:
    """Why a RunPod node type's node_config cannot make a Ray node ("" if it can): what v2
    and RunPod's networking rule out, with the fix."""
    if "deploy_input" in node_config:
        return DEPLOY_INPUT_GONE
    if node_config.get("interruptible"):
        return ("RunPod's interruptible pods cannot join a Ray cluster: only its GraphQL API "
                "creates them, without global networking, so they cannot reach the head. To "
                "fix: set interruptible: false (on-demand pods), or train on AWS spot nodes")
    for gone, why in (("support_public_ip", "REST API v2 publishes a pod's SSH itself "
                       "(ssh.direct) when 22/tcp is in its ports"),
                      ("bid_per_gpu", "there are no interruptible Ray nodes on RunPod")):
        if gone in node_config:
            return f"{gone} is no longer used: {why}. To fix: remove it"
    return ""


def pod_env(pod: dict[str, Any]) -> dict[str, str]:
    """A pod's environment (v2: an object of strings)."""
    env = pod.get("env") or {}
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    return dict(item.split("=", 1) for item in env if isinstance(item, str) and "=" in item)


def pod_ssh(pod: dict[str, Any]) -> tuple[str, int] | None:
    """Where the pod's sshd answers from outside: `ssh.direct` (its public address and the
    port `22/tcp` is published on); None until RunPod assigns one (while it boots)."""
    direct = (pod.get("ssh") or {}).get("direct") or {}
    if direct.get("host") and isinstance(direct.get("port"), int):
        return str(direct["host"]), int(direct["port"])
    return None


def pod_private_ip(pod: dict[str, Any]) -> str:
    """The pod's address on RunPod's global network ("" until it has one)."""
    network = pod.get("globalNetworking") or {}
    return str(network.get("ip") or "") if network.get("enabled") else ""
