"""Start and stop the service on a Ray cluster: the effects behind `raytrain serve` and `demo`.

    started_ray = connect_ray(address=None)       # a local cluster when no address is given
    url = deploy(ServiceConfig(), host="127.0.0.1", port=8000)
    undeploy(stop_jobs=True)
"""

from __future__ import annotations

import logging
import os
import socket
import time

import httpx
import psutil
import ray
from ray import serve

from raytrain.errors import RaytrainError
from raytrain.serve.app import APP_NAME, build_app
from raytrain.serve.manager import find_manager
from raytrain.spec import ServiceConfig

logger = logging.getLogger(__name__)


def connect_ray(address: str | None, num_cpus: int | None = None, quiet: bool = False) -> bool:
    """Connect to the cluster at `address`, or start a local one; True if we started it.

    quiet: do not stream worker logs to this process (the demo draws a progress bar instead;
    a failed job's error is in its status)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return False
    if address:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=not quiet)
        except ConnectionError as exc:
            raise RaytrainError(
                f"cannot connect to the Ray cluster at {address}: {exc}. To fix: check the "
                "address (ray status on the head node prints it), or leave out --address "
                "to start a local cluster"
            ) from None
        return False
    # Serve's controller reconciles every 0.1 s by default: on a small head node that is a
    # measurable share of the CPU training wants (BENCHMARKS.md, background CPU), and a
    # training service redeploys rarely. Only for clusters we start; an operator's wins.
    os.environ.setdefault("RAY_SERVE_CONTROL_LOOP_INTERVAL_S", "1.0")
    ray.init(
        num_cpus=num_cpus or os.cpu_count() or 2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        log_to_driver=not quiet,
    )
    _lower_ray_daemons()
    return True


# Processes of a local cluster that serve Ray itself rather than run tasks.
_DAEMONS = ("gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
_DAEMON_SCRIPTS = ("autoscaler/_private/monitor.py", "dashboard/dashboard.py", "log_monitor.py")


def _lower_ray_daemons(niceness: int = 10) -> None:
    """Run the GCS, agents, monitor and log monitor of a cluster we started at `niceness`.

    Training ranks run at 0 (launcher.py) and Ray's workers for the service at 15. Ray's
    daemons start at 0, level with the ranks, so on a small machine whose cores the ranks
    fill, their periodic work stalls a rank while its peers wait at the next collective;
    below the ranks it runs in the gaps instead. The raylet keeps 0: every worker it starts
    inherits its priority."""
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            if child.name() in _DAEMONS or any(script in command for script in _DAEMON_SCRIPTS):
                child.nice(niceness)
        except psutil.Error:  # gone, or not ours to change: leave it
            continue


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def deploy(config: ServiceConfig, host: str, port: int, timeout_s: float = 120.0) -> str:
    """Deploy the HTTP app on the connected cluster and wait until it answers; return its URL."""
    serve.start(
        http_options={"host": host, "port": port},
        logging_config={"log_level": "WARNING", "enable_access_log": False},
    )
    serve.run(build_app(config), name=APP_NAME, route_prefix="/")
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                return url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RaytrainError(f"the service did not answer at {url} within {timeout_s:.0f} s")
        time.sleep(0.2)


def undeploy(stop_jobs: bool) -> None:
    """Remove the HTTP app; with stop_jobs, also stop the job manager and its running jobs."""
    serve.shutdown()
    manager = find_manager() if stop_jobs else None
    if manager is not None:
        try:
            ray.get(manager.shutdown.remote(), timeout=30)
        finally:
            ray.kill(manager, no_restart=True)
