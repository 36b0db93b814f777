"""The real Ray autoscaler, with Ray's fake multi-node provider, buys exactly the node type the
policy chose for a job; the job trains there and the node goes away after it ends.

The fake cluster is a second Ray cluster on this host (cluster/local-fake.yaml), started and
stopped by this test; the service runs on it through `raytrain serve --detach`, and the test
talks to it only over HTTP (and a probe process that lists the cluster's nodes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import yaml

from raytrain.client import Client
from raytrain.spec import JobState
from tests.integration.conftest import free_port, wait_for
from tests.integration.test_service import job_spec

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]


class FakeCluster:
    def __init__(self, root: Path, port: int, url: str) -> None:
        self.root, self.port, self.url = root, port, url
        self.address = f"127.0.0.1:{port}"

    def worker_node_types(self) -> list[str]:
        """The node types of the alive worker nodes (each carries its own type's resource)."""
        out = subprocess.run([sys.executable, "-m", "tests.integration.cluster_probe",
                              self.address], cwd=REPO, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        types = []
        for node in json.loads(out.strip().splitlines()[-1]):
            types += [k for k in node["resources"] if k in ("cpu-spot", "cpu-on-demand")]
        return sorted(types)


def _stop(root: Path, port: int) -> None:
    """Kill this cluster's processes and their children only (`ray stop` would kill every
    Ray on the host, the other tests' cluster included)."""
    marks = (str(root), f"127.0.0.1:{port}")
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if proc.info["pid"] != os.getpid() and any(mark in cmdline for mark in marks):
            try:
                found += [proc, *proc.children(recursive=True)]
            except psutil.Error:
                pass
    for proc in found:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=10)


@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[FakeCluster]:
    root = Path(tempfile.mkdtemp(prefix="rtf", dir="/tmp"))  # short: Ray's socket paths
    port, http_port = free_port(), free_port()
    config = yaml.safe_load((REPO / "cluster/local-fake.yaml").read_text())
    config["provider"]["gcs_address"] = f"127.0.0.1:{port}"
    (root / "cluster.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "RAY_enable_autoscaler_v2": "0", "RAY_AUTH_MODE": "disabled"}
    try:
        subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={port}", "--num-cpus=1",
                        "--include-dashboard=false", "--disable-usage-stats",
                        f"--autoscaling-config={root / 'cluster.yaml'}",
                        f"--temp-dir={root / 'ray'}"],
                       env=env, check=True, capture_output=True, timeout=120)
        subprocess.run([str(BIN / "raytrain"), "serve", f"--address=127.0.0.1:{port}",
                        f"--port={http_port}", "--config", str(REPO / "cluster/local-fake-service.yaml"),
                        f"--state-dir={root / 'state'}", "--detach"],
                       env=env, check=True, capture_output=True, timeout=180, cwd=REPO)
        yield FakeCluster(root, port, f"http://127.0.0.1:{http_port}")
    finally:
        _stop(root, port)


def test_the_autoscaler_launches_the_chosen_node_type_and_lets_it_go(
    fake_cluster: FakeCluster,
) -> None:
    client = Client(fake_cluster.url)
    spec = job_spec(steps=60, checkpoint_every=30)
    assert fake_cluster.worker_node_types() == []  # nothing bought yet
    job = client.submit(spec)
    # The policy picks spot (0.03 $/h against 0.10 on demand) for a job this short.
    running = wait_for(lambda: (s := client.get(job.id)).state in (
        JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED) and s, 150, "the job to start")
    assert running.error is None, running.error
    resources = running.resources
    assert (resources.node_type, resources.market, resources.offer) == (
        "cpu-spot", "spot", "local/here/cpu-2")
    assert resources.nodes == 1 and resources.hourly_usd == pytest.approx(0.03)
    first = running.decisions[0]
    assert (first.event, first.action, first.market) == ("submit", "start", "spot")
    assert "1 x cpu-2 spot" in first.reason
    # Exactly the chosen node type came up; the workers can only run there (they each ask
    # for half of its cpu-spot resource).
    assert fake_cluster.worker_node_types() == ["cpu-spot"]
    final = job.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.result is not None and final.result.final_loss < final.result.first_loss
    assert final.cost_usd > 0  # 0.03 $/h for the time it held the node
    # The request is withdrawn; the idle node goes (idle_timeout_minutes: 0.1).
    wait_for(lambda: fake_cluster.worker_node_types() == [], 90, "the spot node to go away")
    offers = client.offers(job_id=job.id)
    assert offers.ranking[0].market == "spot" and offers.decision
    assert offers.source == "file" and offers.offers[0].id == "local/here/cpu-2"
