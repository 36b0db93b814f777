"""The service's HTTP API on a real socket on 127.0.0.1, without Ray: the app `raytrain serve`
deploys (serve.http.app.build_app), over a real job manager whose Ray adaptor is the recording
fake (raytrain/testing/fake_ray.py), served as a replica serves it (serve.http.front: uvicorn on a
thread, status reads from memory). For tests and benchmarks that speak HTTP to
the API at a rate a Ray cluster on this machine could not take (the fuzzer's hundreds of jobs).

    with served(tmp_path) as (url, token):
        httpx.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {token}"})

`served_training` is the same app over a scheduling job manager whose runs train for real,
each in a thread (tests/fake_ray.TrainingRay): for the browser and the degraded-store tests.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from raytrain.serve.http.app import InProcess, build_app
from raytrain.serve.http.auth import AuthPace, operator_token
from raytrain.serve.http.front import Front
from raytrain.serve.jobs.manager import JobManager
from raytrain.spec import ServiceConfig
from raytrain.testing.fake_ray import FakeRay, TrainingRay

# The status copy's long-poll: short, since stopping waits for the thread that holds it.
POLL_S = 1.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(state_dir: Path, port: int | None = None, auth_pace: AuthPace = AuthPace(),
           **config: Any) -> Iterator[tuple[str, str]]:
    """The API on http://127.0.0.1:<port, default a free one>; (its URL, the operator
    token)."""
    service_config = ServiceConfig(state_dir=str(state_dir), **config)
    manager = JobManager(service_config.model_dump(mode="json"), cluster=FakeRay(cpus=64),
                         schedule=False).start()
    app = build_app(InProcess(manager), service_config.open_metrics, service_config.auth,
                    cached_reads=POLL_S, auth_pace=auth_pace)
    front = Front(app, "127.0.0.1", port or 0)
    try:
        yield f"http://127.0.0.1:{front.sock.getsockname()[1]}", operator_token(service_config)
    finally:
        front.stop()
        manager.shutdown()


@contextmanager
def served_training(state_dir: Path, cluster: TrainingRay, **config: Any
                    ) -> Iterator[tuple[str, str]]:
    """The API over a job manager that schedules on its own thread, on `cluster`, whose runs
    train in threads of this process; (its URL, the operator token). The cluster's held run,
    if any, is let go before the service stops."""
    service_config = ServiceConfig(state_dir=str(state_dir), **config)
    manager = cluster.manager = JobManager(service_config.model_dump(mode="json"),
                                           cluster=cluster).start()
    app = build_app(InProcess(manager), service_config.open_metrics, service_config.auth,
                    cached_reads=0.2)
    front = Front(app, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{front.sock.getsockname()[1]}", operator_token(service_config)
    finally:
        cluster.go.set()
        front.stop()
        manager.shutdown()
