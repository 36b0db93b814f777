"""A Ray cluster raytrain starts on this machine talks to nothing beyond it.

Ray 2.60's dashboard process (started even with `include_dashboard=False`, to run its
usage-statistics module) does two things on its own at start-up, with usage statistics off:
- it asks the cloud metadata address (169.254.169.254, and metadata.google.internal) which
  cloud it runs on whenever `~/ray_bootstrap_config.yaml` is absent
  (`ray/_common/usage/usage_lib.py`, `get_cluster_config_to_report`);
- on a cluster `ray start` made, it tells Ray's servers that usage statistics are off
  (`usage_stats_head.py`, `_report_disabled_usage_sync`, to `RAY_USAGE_STATS_REPORT_URL`).
No setting turns either off. So while Ray starts that one process, `HOME` names a folder of
ours holding an empty `ray_bootstrap_config.yaml` (nothing to probe for) and the report's
address is this machine's discard port (refused at once); every other process of the cluster
(GCS, raylets, workers) keeps the real environment.

This wraps `ray._private.services.start_api_server`, Ray's private function that starts the
dashboard process: no public API reaches that process's environment.
tests/service/test_ray_private.py fails when Ray changes what this relies on, and
tests/service/ray/test_service.py asserts that a local run connects to nothing beyond this
machine.

    install_no_cloud_probe(Path("/tmp/raytrain-x"))   # before ray.init or `ray start`
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Where the dashboard's report goes instead of Ray's servers: the discard port on loopback.
NOWHERE = "http://127.0.0.1:9/"


def dashboard_home(folder: Path) -> Path:
    """A HOME for Ray's dashboard process: an empty cluster config, so it probes no cloud."""
    home = folder / "dashboard-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "ray_bootstrap_config.yaml").write_text("{}\n")
    return home


def install_no_cloud_probe(folder: Path) -> None:
    """Make every dashboard process Ray starts from this process start with HOME at
    `dashboard_home(folder)` and its usage report sent nowhere (module docstring)."""
    from ray._private import services

    start = services.start_api_server
    if getattr(start, "raytrain_home", None) is not None:
        start = start.__wrapped__  # type: ignore[attr-defined]
    home = dashboard_home(folder)

    @functools.wraps(start)
    def start_api_server(*args: Any, **kwargs: Any) -> Any:
        with environment({"HOME": str(home), "RAY_USAGE_STATS_REPORT_URL": NOWHERE}):
            return start(*args, **kwargs)

    start_api_server.raytrain_home = home  # type: ignore[attr-defined]
    services.start_api_server = start_api_server


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """`values` in this process's environment inside the block (the processes it starts
    inherit them), each variable put back as it was after."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str]) -> None:
    """`python -m raytrain.serve.adaptors.ray_probe FOLDER ARGS...`: Ray's own CLI (`ray ARGS...`)
    with the probe held at home; `serve --detach` starts its head node so."""
    from ray.scripts.scripts import cli

    install_no_cloud_probe(Path(argv[0]))
    cli(args=argv[1:], prog_name="ray")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
