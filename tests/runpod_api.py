"""A local fake of RunPod's APIs on 127.0.0.1, speaking what raytrain.cloud.runpod sends:
- the REST API's pod create (`POST /v1/pods`), its input checked against the fields and types
  of RunPod's API reference (PodCreateInput), so a misspelt or mistyped field is refused;
- the GraphQL operations, executed by graphql-core against the part of RunPod's published
  schema they use;
with bearer-key checks, stock, interruptible prices, and faults to inject.

    with FakeRunPod(stock={"NVIDIA GeForce RTX 4090": 8}) as fake:
        api = RunPodAPI(fake.key, url=fake.url, rest_url=fake.rest_url)
        fake.fail_next(status=503); fake.reclaim(pod_id)
        fake.delay_s, fake.delayed = 5, 1     # the next answer comes 5 s late

`on_create(pod)`, `on_terminate(pod)` and `on_reclaim(pod)` let a test start and stop what a
pod stands for (a local Ray worker node, say); on_create may add to the pod's
`runtime.ports` (the public port its SSH answers on, tests/fake_pods.py).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from graphql import build_schema, graphql_sync

SCHEMA = build_schema("""
type Query { gpuTypes(input: GpuTypeFilter): [GpuType]  myself: User  pod(input: PodFilter): Pod }
type Mutation { podTerminate(input: PodTerminateInput!): Boolean }
input GpuTypeFilter { id: String }
input PodFilter { podId: String! }
input LowestPriceInput { gpuCount: Int }
type GpuType {
  id: String displayName: String memoryInGb: Int maxGpuCount: Int
  securePrice: Float communityPrice: Float secureSpotPrice: Float communitySpotPrice: Float
  lowestPrice(input: LowestPriceInput): LowestPrice
}
type LowestPrice { minimumBidPrice: Float uninterruptablePrice: Float stockStatus: String }
type User { id: String pods: [Pod] }
type Pod {
  id: String! name: String desiredStatus: String env: [String] costPerHr: Float
  gpuCount: Int machineId: String runtime: PodRuntime
}
type PodRuntime { ports: [PodRuntimePorts] }
type PodRuntimePorts {
  ip: String isIpPublic: Boolean privatePort: Int publicPort: Int type: String
}
input PodTerminateInput { podId: String! }
""")

# RunPod's REST PodCreateInput (docs.runpod.io/api-reference/pods/POST/pods): each field and
# the JSON type it takes ("list" of strings, "env" an object of strings).
CREATE_FIELDS = {
    "allowedCudaVersions": "list", "cloudType": str, "computeType": str,
    "containerDiskInGb": int, "containerRegistryAuthId": str, "countryCodes": "list",
    "cpuFlavorIds": "list", "cpuFlavorPriority": str, "dataCenterIds": "list",
    "dataCenterPriority": str, "dockerEntrypoint": "list", "dockerStartCmd": "list",
    "env": "env", "globalNetworking": bool, "gpuCount": int, "gpuTypeIds": "list",
    "gpuTypePriority": str, "imageName": str, "interruptible": bool, "locked": bool,
    "minDiskBandwidthMBps": float, "minDownloadMbps": float, "minRAMPerGPU": int,
    "minUploadMbps": float, "minVCPUPerGPU": int, "name": str, "networkVolumeId": str,
    "ports": "list", "supportPublicIp": bool, "templateId": str, "vcpuCount": int,
    "volumeInGb": int, "volumeMountPath": str,
}

# Per GPU-hour: (on-demand, interruptible now). The A4000: a small head pod.
PRICES = {"NVIDIA GeForce RTX 4090": (0.59, 0.34), "NVIDIA H100 80GB HBM3": (2.99, 2.09),
          "NVIDIA RTX A4000": (0.25, 0.15)}
MEMORY_GB = {"NVIDIA GeForce RTX 4090": 24, "NVIDIA H100 80GB HBM3": 80, "NVIDIA RTX A4000": 16}
# Data centers, and whether each offers global networking.
DATA_CENTERS = {"EU-RO-1": True, "US-TX-3": True, "US-GA-1": False, "CA-MTL-1": False}


class Refused(Exception):
    pass


class FakeRunPod:
    def __init__(self, stock: dict[str, int] | None = None, key: str = "rp_test_key") -> None:
        self.key = key
        self.stock = dict(stock if stock is not None else {g: 8 for g in PRICES})
        self.pods: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.delay_s = 0.0  # how late the next `delayed` answers come (after the work)
        self.delayed = 0
        self._fail: list[tuple[int, str, str]] = []
        self.on_create: Callable[[dict[str, Any]], None] = lambda pod: None
        self.on_terminate: Callable[[dict[str, Any]], None] = lambda pod: None
        self.on_reclaim: Callable[[dict[str, Any]], None] = lambda pod: self.on_terminate(pod)
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                authorization = self.headers.get("Authorization", "")
                if self.path.rstrip("/") == "/v1/pods":
                    status, answer = fake.create(authorization, body)
                else:
                    status, answer = fake.answer(authorization, body)
                if fake.delayed > 0:
                    fake.delayed -= 1
                    time.sleep(fake.delay_s)
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout the test asked for)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/graphql"
        self.rest_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeRunPod:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -------------------------------------------------------------- what tests do

    def fail_next(self, status: int = 503, message: str = "internal error",
                  operation: str = "") -> None:
        """The next request (naming `operation` if given: a GraphQL operation such as
        podTerminate, or "POST /v1/pods") answers `status` (for GraphQL, a 200 with an error
        `message`)."""
        self._fail.append((status, message, operation))

    def _failure(self, request: str) -> tuple[int, str] | None:
        failing = next((f for f in self._fail if f[2] in request), None)
        if failing is None:
            return None
        self._fail.remove(failing)
        return failing[0], failing[1]

    def reclaim(self, pod_id: str) -> None:
        """RunPod takes an interruptible pod back (outbid, or its host reclaimed): no
        notice; the pod is gone and billing stops."""
        with self.lock:
            pod = self.pods.pop(pod_id, None)
            if pod is None:
                return  # terminated meanwhile
            self.stock[pod["gpuTypeId"]] += pod["gpuCount"]
        self.on_reclaim(pod)

    def running(self) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.pods.values() if p["desiredStatus"] == "RUNNING"]

    # ------------------------------------------------------------------- the API

    def answer(self, authorization: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if authorization != f"Bearer {self.key}":
            return 401, {"errors": [{"message": "Unauthorized",
                                     "extensions": {"code": "UNAUTHENTICATED"}}]}
        request = json.loads(body)
        failing = self._failure(request["query"])
        if failing is not None:
            status, message = failing
            if status != 200:
                return status, {"error": message}
            return 200, {"errors": [{"message": message}], "data": None}
        self.requests.append(request)
        result = graphql_sync(SCHEMA, request["query"], root_value=self,
                              variable_values=request.get("variables"))
        answer: dict[str, Any] = {"data": result.data}
        if result.errors:
            answer["errors"] = [{"message": e.message} for e in result.errors]
        return 200, answer

    def gpuTypes(self, info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # noqa: A002,N802
        return [self._gpu(gpu_id) for gpu_id in PRICES
                if input is None or input.get("id") in (None, gpu_id)]

    def _gpu(self, gpu_id: str) -> dict[str, Any]:
        on_demand, bid = PRICES[gpu_id]
        fake = self

        def lowest(info: Any, input: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: A002
            count = (input or {}).get("gpuCount") or 1
            free = fake.stock.get(gpu_id, 0)
            return {"minimumBidPrice": bid if free >= count else None,
                    "uninterruptablePrice": on_demand if free >= count else None,
                    "stockStatus": "High" if free >= 8 else "Low" if free >= count else None}

        return {"id": gpu_id, "displayName": gpu_id, "memoryInGb": MEMORY_GB[gpu_id],
                "maxGpuCount": 8, "securePrice": on_demand, "communityPrice": on_demand,
                "secureSpotPrice": bid, "communitySpotPrice": bid, "lowestPrice": lowest}

    def myself(self, info: Any) -> dict[str, Any]:
        with self.lock:
            return {"id": "user", "pods": [self._public(p) for p in self.pods.values()]}

    def pod(self, info: Any, input: dict[str, Any]) -> dict[str, Any] | None:  # noqa: A002
        pod = self.pods.get(input["podId"])
        return self._public(pod) if pod else None

    def create(self, authorization: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST /v1/pods. RunPod's reference does not document its error answers: here a bad
        input, an unknown GPU type and no capacity are each a 400 with an `error` text."""
        if authorization != f"Bearer {self.key}":
            return 401, {"error": "Unauthorized", "status": 401}
        failing = self._failure("POST /v1/pods")
        if failing is not None:
            return failing[0], {"error": failing[1], "status": failing[0]}
        request = json.loads(body)
        self.requests.append({"rest": "POST /v1/pods", "body": request})
        refused = _refused_input(request)
        if refused:
            return 400, {"error": refused, "status": 400}
        try:
            return 200, self._deploy(request)
        except Refused as exc:
            return 400, {"error": f"create pod: {exc}", "status": 400}

    def podTerminate(self, info: Any, input: dict[str, Any]) -> None:  # noqa: A002,N802
        """As RunPod does: the pod is gone from the account at once, and its machine stops it
        in the background (the answer does not wait for the container to stop)."""
        with self.lock:
            pod = self.pods.pop(input["podId"], None)
            if pod is not None:
                self.stock[pod["gpuTypeId"]] += pod["gpuCount"]
        if pod is not None:
            threading.Thread(target=self.on_terminate, args=(pod,), daemon=True).start()

    def _deploy(self, spec: dict[str, Any]) -> dict[str, Any]:
        gpu_id, count = (spec.get("gpuTypeIds") or [""])[0], spec.get("gpuCount") or 1
        if gpu_id not in PRICES:
            raise Refused(f"Invalid gpu type {gpu_id}")
        interruptible = bool(spec.get("interruptible"))
        price = PRICES[gpu_id][1 if interruptible else 0]
        centers = spec.get("dataCenterIds") or list(DATA_CENTERS)
        unknown = [c for c in centers if c not in DATA_CENTERS]
        if unknown:
            raise Refused(f"Invalid data center id {unknown[0]}")
        if spec.get("globalNetworking") and not any(DATA_CENTERS[c] for c in centers):
            raise Refused("Global networking is not available in data centers "
                          + ", ".join(centers))
        with self.lock:
            if self.stock.get(gpu_id, 0) < count:
                raise Refused("There are no longer any instances available with the "
                                   "requested specifications. Please refresh and try again.")
            self.stock[gpu_id] -= count
            pod = {"id": uuid.uuid4().hex[:14], "name": spec.get("name"),
                   "desiredStatus": "RUNNING", "gpuTypeId": gpu_id, "gpuCount": count,
                   "env": [f"{k}={v}" for k, v in (spec.get("env") or {}).items()],
                   "costPerHr": round(price * count, 4),
                   "machineId": uuid.uuid4().hex[:8], "interruptible": interruptible,
                   "globalNetworking": bool(spec.get("globalNetworking")),
                   # The pod's private address on RunPod's global network: this host here.
                   "runtime": {"ports": [{"ip": "127.0.0.1", "isIpPublic": False,
                                          "privatePort": 22, "publicPort": 22,
                                          "type": "tcp"}]},
                   "dockerStartCmd": list(spec.get("dockerStartCmd") or []),
                   "ports": list(spec.get("ports") or []),
                   "supportPublicIp": bool(spec.get("supportPublicIp"))}
            self.pods[pod["id"]] = pod
        self.on_create(pod)
        return {"id": pod["id"], "name": pod["name"], "desiredStatus": "RUNNING",
                "env": dict(spec.get("env") or {}), "costPerHr": pod["costPerHr"],
                "gpuCount": count, "interruptible": interruptible,
                "machineId": pod["machineId"]}

    @staticmethod
    def _public(pod: dict[str, Any]) -> dict[str, Any]:
        return {k: pod[k] for k in ("id", "name", "desiredStatus", "env", "costPerHr",
                                    "gpuCount", "machineId", "runtime")}


def _refused_input(body: Any) -> str:
    """Why RunPod would refuse a create input: an unknown field or a wrong type; else ""."""
    if not isinstance(body, dict):
        return "the body must be a JSON object"
    for name, value in body.items():
        kind = CREATE_FIELDS.get(name)
        if kind is None:
            return f"unknown field {name!r}"
        if kind == "list":
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
        elif kind == "env":
            ok = isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            return f"field {name!r} has the wrong type"
    return ""
