"""A fake multi-node Ray cluster with the real autoscaler, the service deployed on it, and an
instance metadata service for its nodes: for tests and benchmarks of buying capacity and of
surviving preemption, on one machine.

    with started_fake_cluster(max_spot_nodes=2) as cluster:
        Client(cluster.url, token=cluster.token).submit(...); cluster.take_node(node_id)
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import psutil
import yaml

from raytrain.serve.auth import OPERATOR, read_tokens
from tests.imds_server import MetadataServer
from tests.integration.conftest import free_port, wait_for

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


class FakeCluster:
    def __init__(self, root: Path, port: int, url: str, metadata: MetadataServer) -> None:
        self.root, self.port, self.url, self.metadata = root, port, url, metadata
        self.address = f"127.0.0.1:{port}"
        self.offers = root / "offers.yaml"  # what the service reads its offers from
        self.token = read_tokens(root / "state")[OPERATOR]  # written as the service started
        self._probe: subprocess.Popen | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()

    def close(self) -> None:
        if self._probe is not None:
            self._probe.kill()
            self._probe.wait()

    def worker_nodes(self) -> dict[str, str]:
        """Alive worker nodes: id -> node type (each carries its own type's resource)."""
        if self._probe is None or self._probe.poll() is not None:
            self._probe = subprocess.Popen(
                [sys.executable, "-m", "tests.integration.cluster_probe", self.address],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=_lines_into, args=(self._probe.stdout, self._answers),
                             daemon=True).start()
        assert self._probe.stdin is not None
        self._probe.stdin.write("\n")
        self._probe.stdin.flush()
        deadline = time.monotonic() + 120
        line = ""
        while not line.startswith("NODES "):
            try:
                line = self._answers.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the cluster probe did not answer within 120 s") from None
            if line is None:
                raise AssertionError("the cluster probe exited")
        nodes = {}
        for node in json.loads(line[len("NODES "):]):
            for kind in ("cpu-spot", "cpu-on-demand"):
                if kind in node["resources"]:
                    nodes[node["id"]] = kind
        return nodes

    def worker_node_types(self) -> list[str]:
        return sorted(self.worker_nodes().values())

    def take_node(self, node_id: str) -> None:
        """Take a node away as a cloud would. Killing its processes is not enough: the fake
        provider would still list it, so the autoscaler would wait for it forever. Instead,
        its node type's max_workers drops to 0 for a moment (the autoscaler rereads its
        config every round), and the autoscaler terminates it through the provider."""
        path = self.root / "cluster.yaml"
        original = path.read_text()
        config = yaml.safe_load(original)
        kind = self.worker_nodes()[node_id]
        config["available_node_types"][kind]["max_workers"] = 0
        path.write_text(yaml.safe_dump(config))
        try:
            wait_for(lambda: node_id not in self.worker_nodes(), 60, f"{kind} node to go")
        finally:
            path.write_text(original)


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


def _lines_into(stream: Any, answers: queue.Queue) -> None:
    for line in stream:
        answers.put(line)
    answers.put(None)


@contextmanager
def started_fake_cluster(max_spot_nodes: int = 1) -> Iterator[FakeCluster]:
    """A second Ray cluster on this host (cluster/local-fake.yaml) with the service on it."""
    root = Path(tempfile.mkdtemp(prefix="rtf", dir="/tmp"))  # short: Ray's socket paths
    port, http_port = free_port(), free_port()
    metadata = MetadataServer()  # every fake node's instance metadata service
    service = yaml.safe_load((REPO / "cluster/local-fake-service.yaml").read_text())
    offers = root / "offers.yaml"  # a copy: tests change prices
    offers.write_text((REPO / "cluster" / service["offers_file"]).read_text())
    service["offers_file"] = str(offers)
    service["interruption_endpoint"] = metadata.url
    service["node_types"]["cpu-spot"]["max_nodes"] = max_spot_nodes
    (root / "service.yaml").write_text(yaml.safe_dump(service))
    config = yaml.safe_load((REPO / "cluster/local-fake.yaml").read_text())
    config["provider"]["gcs_address"] = f"127.0.0.1:{port}"
    config["available_node_types"]["cpu-spot"]["max_workers"] = max_spot_nodes
    config["max_workers"] = max(config["max_workers"], max_spot_nodes + 1)
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
                        f"--port={http_port}", "--config", str(root / "service.yaml"),
                        f"--state-dir={root / 'state'}", "--detach"],
                       env=env, check=True, capture_output=True, timeout=180, cwd=REPO)
        cluster = FakeCluster(root, port, f"http://127.0.0.1:{http_port}", metadata)
        try:
            yield cluster
        finally:
            cluster.close()
    finally:
        _stop(root, port)
        metadata.close()
