"""The service's HTTP API on a real socket on 127.0.0.1, without Ray: the app `raytrain serve`
deploys (serve.app.build_app), over a real job manager whose Ray adaptor is the recording fake
(tests/fake_ray.py), served by uvicorn on a thread. For tests and benchmarks that speak HTTP to
the API at a rate a Ray cluster on this machine could not take (the fuzzer's hundreds of jobs).

    with served(tmp_path) as (url, token):
        httpx.get(f"{url}/v1/jobs", headers={"Authorization": f"Bearer {token}"})
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import uvicorn

from raytrain.serve.app import InProcess, build_app
from raytrain.serve.auth import operator_token
from raytrain.serve.manager import JobManager
from raytrain.spec import ServiceConfig
from tests.fake_ray import FakeRay

START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(state_dir: Path, port: int | None = None, **config: Any) -> Iterator[tuple[str, str]]:
    """The API on http://127.0.0.1:<port, default a free one>; (its URL, the operator
    token)."""
    service_config = ServiceConfig(state_dir=str(state_dir), **config)
    manager = JobManager(service_config.model_dump(mode="json"), cluster=FakeRay(cpus=64),
                         schedule=False)
    app = build_app(InProcess(manager), service_config.open_metrics,
                    service_config.auth)
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the API did not start on port {port}")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", operator_token(service_config)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        manager.shutdown()
