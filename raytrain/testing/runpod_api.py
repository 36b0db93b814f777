"""A local fake of RunPod's APIs on 127.0.0.1, as RunPod serves them today (its REST API v2
OpenAPI document, docs.runpod.io/api-reference-v2, read 2026-12-06), for what
raytrain.cloud.runpod calls:
- REST v2: `POST /v2/pods` (the body checked against CreatePodRequest's fields and types:
  an unknown field, a v1 name such as `imageName` among them, is a 422), `GET /v2/pods`,
  `GET` and `DELETE /v2/pods/{id}`, `GET /v2/catalog/gpus` (include=AVAILABILITY needs
  product, as RunPod's does) and `GET /v2/catalog/datacenters`; pods go PROVISIONING ->
  RUNNING (after `boot_s`), with `ssh.direct` once running and `globalNetworking.ip`;
  errors as RFC 9457 problem documents (400 no capacity, 402 no balance, 404, 422); the
  `RateLimit` / `RateLimit-Policy` headers on every answer and a 429 with `Retry-After` past
  the quota;
- GraphQL only for what raytrain still asks of it, executed by graphql-core: the
  interruptible price (`gpuTypes { lowestPrice { minimumBidPrice } }`) and the interruptible
  pod (`podRentInterruptable`: no global networking, as RunPod's; the pod then shows in v2's
  listing like any other, and `reclaim` takes it back);
- REST v1 (`/v1/...`): 410 Gone, as RunPod has answered since 2026-11-15.

    with FakeRunPod(stock={"NVIDIA GeForce RTX 4090": 8}) as fake:
        api = RunPodAPI(fake.key, url=fake.url, rest_url=fake.rest_url)
        fake.fail_next(status=503); fake.reclaim(pod_id); fake.quota, fake.window_s = 3, 2
        fake.delay_s, fake.delayed = 5, 1     # the next answer comes 5 s late

`on_create(pod)`, `on_terminate(pod)` and `on_reclaim(pod)` let a test start and stop what a
pod stands for (a local Ray worker node, say); on_create may set the pod's `ssh_port` (where
its SSH answers, raytrain/testing/fake_pods.py), which `ssh.direct` then names.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from graphql import build_schema, graphql_sync

SCHEMA = build_schema("""
type Query { gpuTypes(input: GpuTypeFilter): [GpuType] }
type Mutation { podRentInterruptable(input: PodRentInterruptableInput!): Pod }
input GpuTypeFilter { id: String }
input EnvVar { key: String! value: String! }
input PodRentInterruptableInput {
  bidPerGpu: Float! gpuTypeId: String! gpuCount: Int name: String imageName: String
  cloudType: String containerDiskInGb: Int volumeInGb: Int ports: String startSsh: Boolean
  dockerArgs: String env: [EnvVar] minVcpuCount: Int minMemoryInGb: Int
}
type Pod { id: String! name: String desiredStatus: String costPerHr: Float }
input LowestPriceInput { gpuCount: Int }
type GpuType { id: String displayName: String lowestPrice(input: LowestPriceInput): LowestPrice }
type LowestPrice { minimumBidPrice: Float uninterruptablePrice: Float stockStatus: String }
""")

# v2's CreatePodRequest (ContainerConfig's fields and its own), each with the JSON type it
# takes; `gpu` is CreateGpuConfig.
CREATE_FIELDS: dict[str, Any] = {
    "name": str, "image": str, "args": str, "disk": int, "ports": "list", "env": "env",
    "registry": str, "cloud": str, "cpu": dict, "dataCenterIds": "list",
    "globalNetworking": bool, "gpu": dict, "mounts": dict, "startJupyter": bool,
    "startSsh": bool, "templateId": str,
}
GPU_FIELDS: dict[str, Any] = {"id": str, "count": int, "allowedCudaVersions": "list",
                              "minCudaVersion": str}

# Per GPU-hour: (on-demand, interruptible now). The A4000: a small head pod.
PRICES = {"NVIDIA GeForce RTX 4090": (0.59, 0.34), "NVIDIA H100 80GB HBM3": (2.99, 2.09),
          "NVIDIA RTX A4000": (0.25, 0.15)}
MEMORY_GB = {"NVIDIA GeForce RTX 4090": 24, "NVIDIA H100 80GB HBM3": 80, "NVIDIA RTX A4000": 16}
# Data centers, and whether each offers global networking.
DATA_CENTERS = {"EU-RO-1": True, "US-TX-3": True, "US-GA-1": False, "CA-MTL-1": False}
NO_STOCK = ("There are no longer any instances available with the requested specifications. "
            "Please refresh and try again.")


class Problem(Exception):
    def __init__(self, status: int, detail: str, errors: list[str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors or []


TITLES = {400: "Bad Request", 401: "Unauthorized", 402: "Payment Required", 404: "Not Found",
          410: "Gone", 422: "Unprocessable Entity", 429: "Too Many Requests",
          500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


class FakeRunPod:
    def __init__(self, stock: dict[str, int] | None = None, key: str = "rp_test_key") -> None:
        self.key = key
        self.stock = dict(stock if stock is not None else {g: 8 for g in PRICES})
        self.pods: dict[str, dict[str, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.delay_s = 0.0  # how late the next `delayed` answers come (after the work)
        self.delayed = 0
        self.boot_s = 0.0  # PROVISIONING for this long after the create
        self.balance_usd = 100.0
        self.quota, self.window_s = 1000, 60.0  # requests per window, per key
        self._window: tuple[float, int] = (time.monotonic(), 0)
        self._fail: list[tuple[int, str, str]] = []
        self.on_create: Callable[[dict[str, Any]], None] = lambda pod: None
        self.on_terminate: Callable[[dict[str, Any]], None] = lambda pod: None
        self.on_reclaim: Callable[[dict[str, Any]], None] = lambda pod: self.on_terminate(pod)
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, answer, headers = fake.handle(
                    method, self.path, self.headers.get("Authorization", ""), body)
                if fake.delayed > 0:
                    fake.delayed -= 1
                    time.sleep(fake.delay_s)
                data = b"" if answer is None else json.dumps(answer).encode()
                problem = status >= 400 and not self.path.startswith("/graphql")
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    if answer is not None:
                        self.send_header("Content-Type", "application/problem+json" if problem
                                         else "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (a timeout the test asked for)

            def do_GET(self) -> None:  # the stdlib's names
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url, self.rest_url, self.v1_url = f"{base}/graphql", f"{base}/v2", f"{base}/v1"

    def __enter__(self) -> FakeRunPod:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -------------------------------------------------------------- what tests do

    def fail_next(self, status: int = 503, message: str = "internal error",
                  operation: str = "") -> None:
        """The next request (naming `operation` if given: "POST /v2/pods", "DELETE /v2/pods",
        "GET /v2/catalog", a GraphQL field such as gpuTypes) answers `status` (for GraphQL
        with 200, an error `message`)."""
        self._fail.append((status, message, operation))

    @property
    def failures_pending(self) -> int:
        """Failures asked for with fail_next that no request has met yet."""
        return len(self._fail)

    def reclaim(self, pod_id: str) -> None:
        """RunPod loses the pod (its host fails, or takes it back): no notice; the pod is gone
        and billing stops."""
        with self.lock:
            pod = self.pods.pop(pod_id, None)
            if pod is None:
                return  # terminated meanwhile
            self.stock[pod["gpu"]["id"]] += pod["gpu"]["count"]
        self.on_reclaim(pod)

    def exit(self, pod_id: str) -> None:
        """The pod's container exits: the pod stays, EXITED, holding its disk."""
        with self.lock:
            self.pods[pod_id]["status"] = "EXITED"

    def running(self) -> list[dict[str, Any]]:
        with self.lock:
            return [self._public(p) for p in self.pods.values()
                    if self._status(p) == "RUNNING"]

    # ------------------------------------------------------------------- the API

    def handle(self, method: str, path: str, authorization: str, body: bytes
               ) -> tuple[int, Any, dict[str, str]]:
        parts = urlsplit(path)
        route = f"{method} {parts.path.rstrip('/')}"
        if authorization != f"Bearer {self.key}":
            return 401, _problem(Problem(401, "missing or invalid bearer token")), {}
        headers = self._count()
        if headers.get("Retry-After"):
            return 429, _problem(Problem(429, "rate limit exceeded for the minute window")), \
                headers
        try:
            failing = next((f for f in self._fail if f[2] in route
                            or (parts.path == "/graphql" and f[2] in body.decode())), None)
            if failing is not None:
                self._fail.remove(failing)
                if parts.path == "/graphql" and failing[0] == 200:
                    return 200, {"errors": [{"message": failing[1]}], "data": None}, headers
                raise Problem(failing[0], failing[1])
            if parts.path.startswith("/v1/"):
                raise Problem(410, "REST API v1 was retired on 2026-11-15; use REST API v2 "
                              "(https://api.runpod.io/v2)")
            return (*self._route(method, parts.path.rstrip("/"), parse_qs(parts.query), body),
                    headers)
        except Problem as problem:
            return problem.status, _problem(problem), headers

    def _count(self) -> dict[str, str]:
        """The rate-limit headers of this request, as RunPod sends them; Retry-After when the
        window's quota is used up."""
        with self.lock:
            started, used = self._window
            now = time.monotonic()
            if now - started >= self.window_s:
                started, used = now, 0
            used += 1
            self._window = (started, used)
        reset = max(1, int(round(started + self.window_s - now)))
        left = max(0, self.quota - used)
        headers = {"RateLimit": f'"minute";r={left};t={reset}',
                   "RateLimit-Policy": f'"minute";q={self.quota};w={int(self.window_s)}'}
        if used > self.quota:
            headers["Retry-After"] = str(reset)
        return headers

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes
               ) -> tuple[int, Any]:
        if path == "/graphql" and method == "POST":
            return self._graphql(json.loads(body))
        if path == "/v2/pods" and method == "POST":
            request = json.loads(body or b"null")
            self.requests.append({"rest": "POST /v2/pods", "body": request})
            return 201, self._create(request)
        if path == "/v2/pods" and method == "GET":
            self.requests.append({"rest": "GET /v2/pods"})
            with self.lock:
                return 200, {"pods": [self._public(p) for p in self.pods.values()]}
        if path.startswith("/v2/pods/") and method in ("GET", "DELETE"):
            pod_id = path.rsplit("/", 1)[1]
            if method == "GET":
                with self.lock:
                    pod = self.pods.get(pod_id)
                    if pod is None:
                        raise Problem(404, "pod not found")
                    return 200, self._public(pod)
            self.requests.append({"rest": "DELETE /v2/pods", "id": pod_id})
            self._terminate(pod_id)
            return 204, None
        if path == "/v2/catalog/gpus" and method == "GET":
            return 200, self._gpus(query)
        if path == "/v2/catalog/datacenters" and method == "GET":
            return 200, {"dataCenters": [
                {"id": c, "name": c, "region": "NORTH_AMERICA", "globalNetwork": network,
                 "networkVolumeTypes": [], "compliance": []}
                for c, network in DATA_CENTERS.items()]}
        raise Problem(404, f"no route {method} {path}")

    def _graphql(self, request: dict[str, Any]) -> tuple[int, Any]:
        self.requests.append(request)
        result = graphql_sync(SCHEMA, request["query"], root_value=self,
                              variable_values=request.get("variables"))
        answer: dict[str, Any] = {"data": result.data}
        if result.errors:
            answer["errors"] = [{"message": e.message} for e in result.errors]
        return 200, answer

    def gpuTypes(self, info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # noqa: A002,N802
        fake = self

        def spot(gpu_id: str) -> Callable[..., dict[str, Any]]:
            def lowest(info: Any, input: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: A002
                count = (input or {}).get("gpuCount") or 1
                free = fake.stock.get(gpu_id, 0) >= count
                return {"minimumBidPrice": PRICES[gpu_id][1] if free else None,
                        "uninterruptablePrice": PRICES[gpu_id][0] if free else None,
                        "stockStatus": "High" if free else None}
            return lowest

        return [{"id": g, "displayName": g, "lowestPrice": spot(g)} for g in PRICES
                if input is None or input.get("id") in (None, g)]

    def podRentInterruptable(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:  # noqa: A002,N802
        """As RunPod: refused below the going price, or with no machine free."""
        gpu_id, count = input["gpuTypeId"], input.get("gpuCount") or 1
        if gpu_id not in PRICES:
            raise ValueError(f"unknown GPU type {gpu_id}")
        if input["bidPerGpu"] < PRICES[gpu_id][1]:
            raise ValueError(f"Your bid {input['bidPerGpu']} is below the minimum bid "
                             f"{PRICES[gpu_id][1]}")
        with self.lock:
            if self.stock.get(gpu_id, 0) < count:
                raise ValueError(NO_STOCK)
            self.stock[gpu_id] -= count
            pod = {"id": uuid.uuid4().hex[:14], "name": input.get("name") or "",
                   "image": input.get("imageName", ""), "args": input.get("dockerArgs", ""),
                   "disk": input.get("containerDiskInGb", 50),
                   "ports": [p for p in (input.get("ports") or "").split(",") if p],
                   "env": {e["key"]: e["value"] for e in input.get("env") or []},
                   "registry": None, "cloud": input.get("cloudType", "SECURE"),
                   "dataCenterId": "US-GA-1", "gpu": {"id": gpu_id, "count": count},
                   "cost": round(input["bidPerGpu"] * count, 4), "globalNetworking": False,
                   "interruptible": True, "created": time.monotonic(),
                   "status": "PROVISIONING", "ssh_port": None}
            self.pods[pod["id"]] = pod
        self.on_create(pod)
        return {"id": pod["id"], "name": pod["name"], "desiredStatus": "RUNNING",
                "costPerHr": pod["cost"]}

    def _gpus(self, query: dict[str, list[str]]) -> dict[str, Any]:
        include = ",".join(query.get("include", []))
        product = ",".join(query.get("product", []))
        if bool(include) != bool(product):
            raise Problem(400, "product is required with include=AVAILABILITY, and valid only "
                          "with it")
        count = int((query.get("count") or ["1"])[0])
        gpus = []
        for gpu_id, (on_demand, _) in PRICES.items():
            free = self.stock.get(gpu_id, 0)
            entry: dict[str, Any] = {
                "id": gpu_id, "name": gpu_id.replace("NVIDIA ", ""), "pool": None,
                "manufacturer": "NVIDIA", "memory": MEMORY_GB[gpu_id], "secure": True,
                "community": True, "price": {"secure": on_demand, "community": on_demand},
                "maxCount": {"secure": 8, "community": 4}}
            if include:
                entry["availability"] = "HIGH" if free >= 8 else "LOW" if free >= count \
                    else "NONE"
            gpus.append(entry)
        return {"gpus": gpus}

    def _create(self, request: Any) -> dict[str, Any]:
        refused = _refused_input(request)
        if refused:
            raise Problem(422, "Request validation failed.", [refused])
        if ("gpu" in request) == ("cpu" in request):
            raise Problem(400, "exactly one of gpu or cpu must be set")
        if "cpu" in request:
            raise Problem(400, "this fake makes GPU pods only")
        gpu_id, count = request["gpu"]["id"], request["gpu"].get("count", 1)
        if gpu_id not in PRICES:
            raise Problem(400, f"unknown GPU type {gpu_id}")
        centers = request.get("dataCenterIds") or list(DATA_CENTERS)
        unknown = [c for c in centers if c not in DATA_CENTERS]
        if unknown:
            raise Problem(400, f"unknown data center {unknown[0]}")
        if request.get("globalNetworking") and not any(DATA_CENTERS[c] for c in centers):
            raise Problem(400, "Global networking is not available in data centers "
                          + ", ".join(centers))
        if self.balance_usd <= 0:
            raise Problem(402, "insufficient balance to deploy this pod")
        with self.lock:
            if self.stock.get(gpu_id, 0) < count:
                raise Problem(400, NO_STOCK)
            self.stock[gpu_id] -= count
            pod = {"id": uuid.uuid4().hex[:14], "name": request["name"],
                   "image": request.get("image", ""), "args": request.get("args", ""),
                   "disk": request.get("disk", 50), "ports": list(request.get("ports") or []),
                   "env": dict(request.get("env") or {}), "registry": None,
                   "cloud": request.get("cloud", "SECURE"),
                   "dataCenterId": next(c for c in centers if DATA_CENTERS[c]
                                        or not request.get("globalNetworking")),
                   "gpu": {"id": gpu_id, "count": count},
                   "cost": round(PRICES[gpu_id][0] * count, 4),
                   "globalNetworking": bool(request.get("globalNetworking")),
                   "created": time.monotonic(), "status": "PROVISIONING", "ssh_port": None}
            self.pods[pod["id"]] = pod
        self.on_create(pod)
        with self.lock:  # the create's answer: provisioning, whatever comes next
            return self._public(pod, status="PROVISIONING")

    def _terminate(self, pod_id: str) -> None:
        """As RunPod does: the pod is gone from the account at once, and its machine stops it
        in the background (the answer does not wait for the container to stop)."""
        with self.lock:
            pod = self.pods.pop(pod_id, None)
            if pod is None:
                raise Problem(404, "pod not found")
            self.stock[pod["gpu"]["id"]] += pod["gpu"]["count"]
        threading.Thread(target=self.on_terminate, args=(pod,), daemon=True).start()

    def _status(self, pod: dict[str, Any]) -> str:
        if pod["status"] == "PROVISIONING" and time.monotonic() - pod["created"] >= self.boot_s:
            pod["status"] = "RUNNING"
        return pod["status"]

    def _public(self, pod: dict[str, Any], status: str = "") -> dict[str, Any]:
        """The pod as v2 shows it (Pod)."""
        status = status or self._status(pod)
        running = status == "RUNNING"
        direct = None
        if running and "22/tcp" in pod["ports"] and pod["ssh_port"]:
            direct = {"host": "127.0.0.1", "port": pod["ssh_port"], "username": "root",
                      "command": f"ssh root@127.0.0.1 -p {pod['ssh_port']}"}
        network: dict[str, Any] = {"enabled": pod["globalNetworking"]}
        if pod["globalNetworking"]:  # its private address on RunPod's network: this host here
            network.update(ip="127.0.0.1", internalDns=f"{pod['id']}.runpod.internal")
        return {
            "id": pod["id"], "name": pod["name"], "status": status,
            "actions": ["stop", "restart", "terminate"] if running else ["terminate"],
            "image": pod["image"], "args": pod["args"], "disk": pod["disk"],
            "mounts": {}, "ports": pod["ports"], "env": dict(pod["env"]), "registry": None,
            "cloud": pod["cloud"], "dataCenterId": pod["dataCenterId"], "cudaVersion": "12.8",
            "gpu": dict(pod["gpu"]),
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": pod["id"],
                              "command": f"ssh {pod['id']}@ssh.runpod.io"}, "direct": direct},
            "template": None, "cost": pod["cost"] if status in ("RUNNING", "PROVISIONING")
            else 0.0, "locked": False, "runtime": {}, "createdAt": "2026-12-06T00:00:00Z",
            "startedAt": None, "globalNetworking": network}


def _problem(problem: Problem) -> dict[str, Any]:
    document: dict[str, Any] = {"title": TITLES.get(problem.status, "Error"),
                                "status": problem.status, "detail": problem.detail}
    if problem.errors:
        document["errors"] = problem.errors
    return document


def _refused_input(body: Any) -> str:
    """Why RunPod would refuse a create body (v2's validation message); else ""."""
    if not isinstance(body, dict):
        return "$: the body must be a JSON object"
    for fields, value, where in ((CREATE_FIELDS, body, "$"),
                                 (GPU_FIELDS, body.get("gpu") or {}, "$.gpu")):
        for name, item in value.items():
            kind = fields.get(name)
            if kind is None:
                return f"{where}: additional properties '{name}' not allowed"
            if kind == "list":
                ok = isinstance(item, list) and all(isinstance(v, str) for v in item)
            elif kind == "env":
                ok = isinstance(item, dict) and all(isinstance(v, str) for v in item.values())
            elif kind is int:
                ok = isinstance(item, int) and not isinstance(item, bool)
            else:
                ok = isinstance(item, kind)
            if not ok:
                return f"{where}.{name}: wrong type"
    if not body.get("name"):
        return "$: missing property 'name'"
    if not body.get("image") and not body.get("templateId"):
        return "$: missing property 'image'"
    if body.get("cloud", "SECURE") not in ("SECURE", "COMMUNITY"):
        return "$.cloud: value must be one of 'SECURE', 'COMMUNITY'"
    if "gpu" in body and (not body["gpu"].get("id") or body["gpu"].get("count", 1) < 1):
        return "$.gpu: id required and count at least 1"
    return ""
