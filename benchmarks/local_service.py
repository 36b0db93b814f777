"""The service on a local Ray cluster for a benchmark: 2 CPUs, 127.0.0.1, state in a new
temporary folder.

    url, token, state = start(prefix="raytrain-load-")   # ... then stop()
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def start(prefix: str, profile_from: Path | None = None, **config: Any
          ) -> tuple[str, str, Path]:
    """Start Ray and the service; (its URL, the operator token, its state folder).
    `profile_from`: a state folder whose measured CPU profile (`raytrain calibrate`) the
    service plans with."""
    import shutil

    from raytrain.serve.deploy import connect_ray, deploy
    from raytrain.serve.http.auth import operator_token
    from raytrain.spec import ServiceConfig
    from raytrain.spec.files import PROFILE_FILE
    from raytrain.testing.http_service import free_port

    state = Path(tempfile.mkdtemp(prefix=prefix))
    if profile_from is not None:
        shutil.copy(profile_from.expanduser() / PROFILE_FILE, state / PROFILE_FILE)
    connect_ray(None, num_cpus=2, quiet=True)
    service_config = ServiceConfig(state_dir=str(state), **config)
    url = deploy(service_config, "127.0.0.1", free_port())
    return url, operator_token(service_config), state


def stop() -> None:
    """Stop the service, its jobs and the local Ray cluster."""
    import ray

    from raytrain.serve.deploy import undeploy

    undeploy(stop_jobs=True)
    ray.shutdown()
