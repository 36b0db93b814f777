"""The only code that talks to RunPod: its REST API to create pods and its GraphQL API for the
rest, over httpx, with the key in an `Authorization: Bearer` header (never in the URL, so no
log line carries it).

Pods are created through the REST API, `POST https://rest.runpod.io/v1/pods` (RunPod's API
reference, docs.runpod.io/api-reference/pods/POST/pods), because only its input has both
`interruptible` and `globalNetworking`: a pod joins the head over RunPod's global network,
whichever the market. The REST API takes no bid; an interruptible pod is rented at the going
price, and a node type's `bid_per_gpu`, if set, is a ceiling checked against that price
first (no pod is created above it).

The GraphQL operations (https://api.runpod.io/graphql, the schema at graphql-spec.runpod.io),
as RunPod's own Python SDK (runpod-python, runpod/api/) sends them:
- `gpuTypes { ... lowestPrice(input: {gpuCount}) { minimumBidPrice uninterruptablePrice
  stockStatus } }`: GPU types, their on-demand price, the lowest interruptible price and
  stock;
- `myself { pods { id name desiredStatus env costPerHr gpuCount ... } }`: the account's pods;
- `podTerminate(input: {podId})`.
Variables carry every value, so no input is ever spliced into a query.

Errors say what failed and how to fix it, and never include the key:
- `RunPodAuthError`: the key was refused;
- `NoCapacity`: no machine has the GPU type in stock, or its interruptible price is above the
  node type's ceiling (the autoscaler's request is not met; the service's policy moves to its
  next offer);
- `RunPodUnavailable`: a timeout, no connection, or a 5xx (worth retrying later).

    api = RunPodAPI(api_key())                       # RUNPOD_API_KEY, or a key file
    api.gpu_types(); api.deploy(...); api.pods(); api.terminate(pod_id)
    catalog = refresh(load_offers(state_dir), api, now=time.time())
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from raytrain.errors import RaytrainError
from raytrain.spec import Offer, OfferCatalog

logger = logging.getLogger(__name__)

API_URL = "https://api.runpod.io/graphql"
REST_URL = "https://rest.runpod.io/v1"
KEY_ENV = "RUNPOD_API_KEY"
KEY_FILE_ENV = "RUNPOD_API_KEY_FILE"
# runpodctl and the runpod SDK keep the key here (`apikey = "..."`).
DEFAULT_KEY_FILE = Path("~/.runpod/config.toml")
TIMEOUT_S = 30.0
# What the catalog calls the GPU types RunPod names (gpuTypes' ids).
GPU_KINDS = {"NVIDIA GeForce RTX 4090": "rtx4090", "NVIDIA H100 80GB HBM3": "h100-sxm"}
INTRA_LINKS = {"rtx4090": "pcie4-no-p2p", "h100-sxm": "nvlink4"}
# Pods reach each other only over RunPod's global networking, at 100 Mbit/s: enough for Ray's
# control plane, far too slow for gradients. Each offer is one pod (max_nodes 1).
POD_NETWORK_GBPS = 0.1

# A node_config key of the GraphQL deploy, refused by the cluster checks and the provider.
DEPLOY_INPUT_GONE = ("deploy_input held the GraphQL deploy's fields; pods are created through "
                     "RunPod's REST API now. To fix: rename it create_input and use the REST "
                     "API's field names")

_NO_STOCK = re.compile(r"no longer any instances available|not enough|out of stock|"
                       r"no (gpu|machine)s? available", re.I)
_LOW_BID = re.compile(r"bid", re.I)
_NO_GLOBAL_NETWORK = re.compile(r"global network", re.I)
_AUTH = re.compile(r"unauthori[sz]ed|invalid (api key|authorization)|UNAUTHENTICATED", re.I)


class RunPodError(RaytrainError):
    """A RunPod API call failed; the message says how to fix it."""


class RunPodAuthError(RunPodError):
    pass


class NoCapacity(RunPodError):
    pass


class RunPodUnavailable(RunPodError):
    pass


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


GPU_TYPES = """
query GpuTypes($count: Int!) {
  gpuTypes {
    id displayName memoryInGb maxGpuCount securePrice communityPrice
    secureSpotPrice communitySpotPrice
    lowestPrice(input: {gpuCount: $count}) { minimumBidPrice uninterruptablePrice stockStatus }
  }
}"""
POD_FIELDS = ("id name desiredStatus env costPerHr gpuCount machineId "
              "runtime { ports { ip isIpPublic privatePort publicPort type } }")
PODS = f"query Pods {{ myself {{ pods {{ {POD_FIELDS} }} }} }}"
TERMINATE = "mutation Terminate($input: PodTerminateInput!) { podTerminate(input: $input) }"


@dataclass
class PodRequest:
    """One pod to create."""

    name: str
    image: str
    gpu_type_id: str
    gpu_count: int
    interruptible: bool
    env: dict[str, str] = field(default_factory=dict)
    bid_per_gpu: float | None = None  # interruptible only: the most to pay per GPU-hour
    cloud_type: str = "SECURE"
    container_disk_gb: int = 50
    docker_args: str = ""  # a shell command the container runs
    ports: tuple[str, ...] = ("22/tcp",)
    support_public_ip: bool = False  # the head's: `ray up` reaches its SSH port
    extra: dict[str, Any] = field(default_factory=dict)  # more create fields, as named

    def body(self) -> dict[str, Any]:
        """The REST API's create input (PodCreateInput)."""
        body: dict[str, Any] = {
            "name": self.name, "imageName": self.image, "computeType": "GPU",
            "gpuTypeIds": [self.gpu_type_id], "gpuCount": self.gpu_count,
            "cloudType": self.cloud_type, "interruptible": self.interruptible,
            "globalNetworking": True, "containerDiskInGb": self.container_disk_gb,
            "volumeInGb": 0, "ports": list(self.ports), "supportPublicIp": self.support_public_ip,
            "env": dict(sorted(self.env.items())),
        }
        if self.docker_args:
            body["dockerStartCmd"] = ["bash", "-c", self.docker_args]
        return {**body, **self.extra}


class RunPodAPI:
    def __init__(self, key: str, url: str = API_URL, rest_url: str = REST_URL,
                 timeout_s: float = TIMEOUT_S) -> None:
        self._http = httpx.Client(timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {key}",
                                           "Content-Type": "application/json"})
        self.url, self.rest_url, self.timeout_s = url, rest_url.rstrip("/"), timeout_s
        self._key = key

    @property
    def key(self) -> str:
        """The key itself: for the head pod's environment (its autoscaler buys the workers),
        never for a log."""
        return self._key

    def __repr__(self) -> str:  # never the key
        return f"RunPodAPI({self.url!r}, {self.rest_url!r})"

    def close(self) -> None:
        self._http.close()

    def _post(self, url: str, body: dict[str, Any], what: str,
              changes: str = "nothing was changed if it was a query") -> httpx.Response:
        """One request; RunPodUnavailable when it gets no answer, RunPodAuthError for a
        refused key."""
        try:
            answer = self._http.post(url, json=body)
        except httpx.TimeoutException:
            raise RunPodUnavailable(f"RunPod did not answer {what} within {self.timeout_s:.0f} "
                                    f"s. To fix: retry later; {changes}") from None
        except httpx.HTTPError as exc:
            raise RunPodUnavailable(f"cannot reach RunPod for {what}: {type(exc).__name__}. To "
                                    "fix: check this machine's network") from None
        if answer.status_code in (401, 403):
            raise _auth_error()
        return answer

    def call(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The `data` of one GraphQL request; the errors above for anything else."""
        what = query.split("(")[0].split("{")[0].strip()
        answer = self._post(self.url, {"query": query, "variables": variables or {}}, what)
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
            codes = {str((e.get("extensions") or {}).get("code", "")) for e in errors}
            if "UNAUTHENTICATED" in codes or _AUTH.search(message):
                raise _auth_error()
            _raise_refusal(what, message)
        if answer.status_code >= 400 or not isinstance(document.get("data"), dict):
            raise RunPodError(f"RunPod answered {what} with {answer.status_code} and no data")
        return document["data"]

    def gpu_types(self, gpu_count: int = 1) -> list[dict[str, Any]]:
        return list(self.call(GPU_TYPES, {"count": gpu_count})["gpuTypes"] or [])

    def deploy(self, request: PodRequest) -> dict[str, Any]:
        """Create a pod (REST); NoCapacity when none can be had, or not under the ceiling."""
        if request.interruptible and request.bid_per_gpu is not None:
            going = lowest_bid(self.gpu_types(request.gpu_count), request.gpu_type_id)
            if going > request.bid_per_gpu:
                raise NoCapacity(f"RunPod's interruptible {request.gpu_type_id} costs "
                                 f"${going:.3f} per GPU-hour now, above this node type's bid "
                                 f"ceiling of ${request.bid_per_gpu:.3f}. To fix: nothing; the "
                                 "policy tries on-demand or another offer (or raise bid_per_gpu)")
        what = f"create pod ({request.gpu_count} x {request.gpu_type_id})"
        answer = self._post(f"{self.rest_url}/pods", request.body(), what,
                            changes="the pod, if made, is found by its name and terminated")
        try:
            document = answer.json()
        except ValueError:
            document = {"error": answer.text[:300]}
        if answer.status_code >= 400:
            message = str(document.get("error") or document.get("message") or document)[:300]
            _raise_refusal(what, message, answer.status_code)
        if not isinstance(document, dict) or not document.get("id"):
            raise NoCapacity(f"RunPod created no {request.gpu_count} x {request.gpu_type_id} "
                             "pod (no machine free). To fix: nothing; the policy tries the "
                             "next offer")
        return document

    def pods(self) -> list[dict[str, Any]]:
        return list((self.call(PODS)["myself"] or {}).get("pods") or [])

    def terminate(self, pod_id: str) -> None:
        self.call(TERMINATE, {"input": {"podId": pod_id}})


def _raise_refusal(what: str, message: str, status: int = 200) -> None:
    """RunPod refused `what` with `message` (at HTTP `status`): no capacity, whatever the
    status (the policy moves on); else RunPodUnavailable for a 5xx, or an error that names
    the refusal."""
    if _NO_STOCK.search(message):
        raise NoCapacity(f"RunPod has no machine for {what} now: {message}. To fix: nothing; "
                         "the policy tries the next offer")
    if _LOW_BID.search(message):
        raise NoCapacity(f"RunPod refused the price for {what}: {message}. To fix: nothing; "
                         "the policy tries on-demand or another offer")
    if _NO_GLOBAL_NETWORK.search(message):
        raise RunPodError(f"RunPod refused {what}: {message}. The pods reach each other only "
                          "over RunPod's global network. To fix: list only data centers that "
                          "offer it in the node type's create_input.dataCenterIds (RunPod's "
                          "console shows them under Global Networking), or leave it out")
    if status >= 500:
        raise RunPodUnavailable(f"RunPod answered {status} to {what}: {message}. To fix: retry "
                                "later (RunPod's side)")
    raise RunPodError(f"RunPod refused {what}: {message}")


def _auth_error() -> RunPodAuthError:
    return RunPodAuthError(f"RunPod refused the API key. To fix: set {KEY_ENV} (or the file "
                           f"{KEY_FILE_ENV} names) to a current key from RunPod's console, "
                           "Settings, API Keys")


def lowest_bid(gpu_types: list[dict[str, Any]], gpu_type_id: str) -> float:
    for gpu in gpu_types:
        if gpu.get("id") == gpu_type_id:
            price = (gpu.get("lowestPrice") or {}).get("minimumBidPrice")
            if price:
                return float(price)
            raise NoCapacity(f"RunPod lists no interruptible {gpu_type_id} now (no minimum "
                             "bid). To fix: nothing; the policy tries the next offer")
    raise RunPodError(f"RunPod has no GPU type {gpu_type_id!r}. To fix: use one of "
                      + ", ".join(sorted(str(g.get("id")) for g in gpu_types)))


def pod_env(pod: dict[str, Any]) -> dict[str, str]:
    """A pod's environment, which RunPod lists as "KEY=value" strings."""
    env = pod.get("env") or []
    if isinstance(env, dict):
        return {str(k): str(v) for k, v in env.items()}
    return dict(item.split("=", 1) for item in env if "=" in item)


def refresh(catalog: OfferCatalog, api: RunPodAPI, now: float) -> OfferCatalog:
    """The catalog with its RunPod offers' prices from the API: on-demand from each GPU type's
    `uninterruptablePrice` for that pod size, interruptible from its `minimumBidPrice`. What
    fails keeps the previous figures with a warning; other providers' rows are unchanged."""
    rows = [o for o in catalog.offers if o.provider == "runpod"]
    warnings: list[str] = []
    refreshed: dict[str, Offer] = {}
    by_kind = {kind: gpu_id for gpu_id, kind in GPU_KINDS.items()}
    for count in sorted({o.gpus_per_node for o in rows}):
        try:
            types = {g["id"]: g for g in api.gpu_types(count)}
        except RunPodError as exc:
            warnings.append(f"RunPod prices for {count}-GPU pods kept from before: {exc}")
            continue
        for offer in (o for o in rows if o.gpus_per_node == count):
            gpu = types.get(by_kind.get(offer.gpu_kind, ""))
            if gpu is None:
                warnings.append(f"RunPod lists no {offer.gpu_kind} now; {offer.id} keeps its "
                                "previous prices")
                continue
            lowest = gpu.get("lowestPrice") or {}
            update: dict[str, Any] = {"note": f"refreshed from RunPod {_day(now)}; stock "
                                              f"{lowest.get('stockStatus') or 'unknown'}"}
            if lowest.get("uninterruptablePrice"):
                update["on_demand_usd_per_hour"] = float(lowest["uninterruptablePrice"]) * count
            if lowest.get("minimumBidPrice"):
                update["spot_usd_per_hour"] = float(lowest["minimumBidPrice"]) * count
            refreshed[offer.id] = Offer.model_validate({**offer.model_dump(), **update})
    for warning in warnings:
        logger.warning("offer refresh: %s", warning)
    source = "aws+runpod" if catalog.source in ("aws", "aws+runpod") else "runpod"
    return OfferCatalog(version=catalog.version, source=source,  # type: ignore[arg-type]
                        fetched_at=now, warnings=[*catalog.warnings, *warnings],
                        offers=[refreshed.get(o.id, o) for o in catalog.offers])


def _day(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%d")
