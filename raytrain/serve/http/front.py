"""The service's HTTP front: the API app on uvicorn inside each Ray Serve replica, all replicas
listening on the service's port together (SO_REUSEPORT), with Serve's own proxy turned off.

    front = Front(app, host="0.0.0.0", port=8000)   # serving on its own thread
    front.alive()                                   # the replica's health check
    front.stop()
    serve.run(serve_app(config, host, port), name=APP_NAME, route_prefix=None)

Ray Serve still runs the replicas: how many (ServiceConfig.http_replicas), on the head node, a
new one when one dies or fails its health check. It no longer carries the requests. Measured on
2 cores against a plain FastAPI app in the same run (BENCHMARKS.md, load), Serve's proxy
answered /healthz at 0.03x the plain app's rate, and Serve's own HAProxy ingress with direct
ingress (RAY_SERVE_ENABLE_HA_PROXY) at about 950 req/s, about 0.1x: every request still pays for
Serve's routing and bookkeeping in the replica. A training service's API is small and its
replicas are few, so each replica serves HTTP itself. The kernel spreads new connections
over the replicas' sockets (Linux lets only processes of the same user share a port); when
one dies its port stays open through the others, and a request caught on the dead one's
connection fails at once (clients retry; see the Client), rather than waiting for Serve to
notice.

Written here because neither uvicorn nor Serve starts a server on a socket shared by several
processes from inside a Serve replica. BoundedHead is uvicorn's httptools protocol with the
request's head bounded (431 past MAX_HEAD_BYTES or MAX_HEADERS, before any app or token
check sees it): uvicorn bounds headers only with h11, not with httptools.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from ray import serve
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from raytrain.errors import RaytrainError
from raytrain.serve.adaptors.ray_cluster import HEAD_NODE_RESOURCE
from raytrain.serve.http.app import build_app
from raytrain.serve.http.limits import MAX_HEAD_BYTES, MAX_HEADERS, MAX_READ_AHEAD
from raytrain.serve.http.reads import POLL_S
from raytrain.spec import ServiceConfig
from raytrain.spec.files import load_cpu_profile

START_TIMEOUT_S = 60.0  # generous: a busy head node starts slowly
GRACE_S = 5


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port that other processes may bind too (SO_REUSEPORT)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise RaytrainError(
            f"cannot listen on {host}:{port}: {exc.strerror}. To fix: stop what holds the "
            "port (another service, or Ray Serve's own proxy on it), or choose another with "
            "--port") from None
    return sock


class BoundedHead(HttpToolsProtocol):
    """A request line and headers over MAX_HEAD_BYTES, or over MAX_HEADERS headers, get 431
    and the connection closed. Counted as the bytes arrive (a head spread over many reads)
    and per parsed header (a head that arrives in one read)."""

    def connection_made(self, transport: Any) -> None:
        self._head_bytes, self._parsed, self._in_head, self._too_large = 0, 0, True, False
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES + MAX_READ_AHEAD:
                self._refuse()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._parsed = True, 0, 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._count(len(name) + len(value) + 4)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def _count(self, size: int) -> None:
        self._parsed += size
        if self._parsed > MAX_HEAD_BYTES or len(self.headers) > MAX_HEADERS:
            self._too_large = True
            raise ValueError("request head too large")  # the parser stops: send_400_response

    def send_400_response(self, msg: str) -> None:
        if self._too_large:
            self._refuse()
        else:
            super().send_400_response(msg)

    def _refuse(self) -> None:
        body = (f'{{"detail": "the request\'s headers are over {MAX_HEAD_BYTES // 1024} KiB or '
                f'{MAX_HEADERS} headers. To fix: send only the headers the API needs"}}').encode()
        self.transport.write(b"".join([
            STATUS_LINE[431], b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n", body]))
        self.transport.close()
        self._in_head = False


class Front:
    """`app` served by uvicorn on its own thread and event loop, on a shared host:port."""

    def __init__(self, app: Any, host: str, port: int) -> None:
        self.sock = listening_socket(host, port)
        # An open event stream never ends by itself: stopping gives it GRACE_S.
        self.server = uvicorn.Server(uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="on",
            timeout_graceful_shutdown=GRACE_S, http=BoundedHead))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="http-front", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.sock.close()
                raise RaytrainError(f"the HTTP server did not start on {host}:{port}")
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.thread.is_alive() and not self.server.should_exit

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the requests under way (at most timeout_s) and close the socket."""
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)
        self.sock.close()


@serve.deployment(
    name="RaytrainAPI",
    logging_config={"log_level": "WARNING", "enable_access_log": False},
    num_replicas=1,
    # on the head node, where the service's port is; with no CPU reserved, like Ray's daemons
    ray_actor_options={"num_cpus": 0, "resources": {HEAD_NODE_RESOURCE: 0.001}},
)
class RaytrainAPI:
    """A Serve replica serving the API over the service's job manager actor on host:port."""

    def __init__(self, config: dict[str, Any], host: str, port: int) -> None:
        from raytrain.serve.jobs.actor import get_or_create_manager

        config_ = ServiceConfig.model_validate(config)
        app = build_app(get_or_create_manager(config_), config_.open_metrics, config_.auth,
                        cached_reads=POLL_S,  # POST /v1/plans: this machine's CPU profile too
                        hardware=load_cpu_profile(config_.state_path))
        self.front = Front(app, host, port)

    def check_health(self) -> None:
        if not self.front.alive():
            raise RuntimeError("the replica's HTTP server stopped")

    def __del__(self) -> None:
        front = getattr(self, "front", None)
        if front is not None:
            front.stop(timeout_s=2 * GRACE_S)


def serve_app(config: ServiceConfig, host: str, port: int) -> serve.Application:
    return RaytrainAPI.options(num_replicas=config.http_replicas).bind(
        config.model_dump(mode="json"), host, port)
