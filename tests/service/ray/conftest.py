"""One local Ray cluster and one deployed service for the whole integration session.

Each Ray Train fit costs 20-35 s on 2 cores, so these tests are the few that prove the real
integration: HTTP on 127.0.0.1 -> Serve -> job manager -> Ray Train workers over gloo.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from raytrain.testing.ray_service import (
    NUM_CPUS,
    Service,
    cancel_what_is_left,
    free_port,
)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

NETAUDIT_DIR = Path(__file__).resolve().parents[2] / "netaudit"


def this_machines_addresses() -> list[str]:
    """Every address of this machine's interfaces, and its DNS resolvers."""
    found = [a.address.split("%")[0] for addrs in psutil.net_if_addrs().values()
             for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)]
    try:
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            if line.startswith("nameserver"):
                found.append(line.split()[1])
    except OSError:
        pass
    return found


def audit_connections(log: Path) -> None:
    """From here on, every Python process started with this environment (Ray's included)
    records connections beyond this machine in `log` (tests/netaudit/sitecustomize.py)."""
    log.touch()
    os.environ["RAYTRAIN_NET_AUDIT_LOG"] = str(log)
    os.environ["RAYTRAIN_NET_AUDIT_ALLOW"] = ",".join(this_machines_addresses())
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(NETAUDIT_DIR), os.environ.get("PYTHONPATH")) if p)












@pytest.fixture(autouse=True)
def no_job_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Cancel what a test on the shared service left queued or running (one that failed
    half-way): otherwise its CPUs starve every test after it."""
    yield
    if "service" in request.fixturenames:
        cancel_what_is_left(request.getfixturevalue("service"))




# The package's, not the session's: its Ray cluster (idle, about 3% of this machine's two
# cores: benchmarks/idle_cluster_cpu.py) stops when the integration tests end, before the unit
# tests run.
@pytest.fixture(scope="package")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    import ray

    from raytrain.serve.deploy import connect_ray, deploy, undeploy
    from raytrain.serve.http.auth import operator_token
    from raytrain.spec import ServiceConfig

    state_dir = tmp_path_factory.mktemp("raytrain-state")
    audit_connections(state_dir / "connections-beyond-this-machine.log")
    connect_ray(None, num_cpus=NUM_CPUS, quiet=True)
    config = ServiceConfig(state_dir=str(state_dir), allowed_import_packages=["raytrain.testing"])
    url = deploy(config, "127.0.0.1", free_port())
    instance = Service(url, state_dir, operator_token(config))
    os.environ["RAYTRAIN_TOKEN"] = instance.token or ""
    instance.config = config  # type: ignore[attr-defined]
    try:
        yield instance
    finally:
        os.environ.pop("RAYTRAIN_TOKEN", None)
        undeploy(stop_jobs=True)
        ray.shutdown()
