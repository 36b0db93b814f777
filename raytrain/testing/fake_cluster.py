"""A multi-node Ray cluster on one machine, started as a user starts one on RunPod: Ray's own `ray
up` with cluster/runpod.yaml (its head's setup and start commands, run over SSH) against a local
fake of RunPod's API (raytrain/testing/runpod_api.py), through raytrain's RunPod node provider
and command runner. The head pod answers SSH on its mapped port (raytrain/testing/fake_pods.py),
runs Ray, the autoscaler and the service; the autoscaler there buys the worker pods; an instance
metadata service gives the nodes' interruption notices; `ray down` ends it. For tests and
benchmarks of buying capacity and of surviving preemption.

Creating a worker pod runs the pod's own start command (its docker args: `ray start` against the
head with the node type's resource), so a real Ray worker node joins; RunPod terminating or
reclaiming a pod kills that node and everything under it, as losing the machine would. The
service prices the two worker node types as the two markets of one local CPU offer
(cluster/local-fake-offers.yaml, cluster/local-fake-service.yaml): these pods train on CPUs.
Both are bought as on-demand pods (RunPod's interruptible pods cannot be Ray nodes:
raytrain.cloud.runpod); "cpu-spot" stands for some cloud's spot nodes, losing them and their
notices (from the metadata server) are the test's to give.

What differs from cluster/runpod.yaml, and why: the pods share this host and its installation
(no pip install; the head's Ray on a free port, in this cluster's folder, one CPU; the service
on a loopback port with this test's offers and policies), the worker node types are CPU pods,
and the API is the fake's.

with started_fake_cluster(max_spot_nodes=2) as cluster: Client(cluster.url,
token=cluster.token).submit(...); cluster.take_node(node_id) cluster.ray("exec", "raytrain token
add alice"); cluster.down()"""

from __future__ import annotations

import json
import os
import queue
import shlex
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

from raytrain.api_tokens import OPERATOR, read_tokens
from raytrain.cloud.runpod import KEY_ENV, pod_env
from raytrain.cloud.runpod_provider import NODE_ID_ENV
from raytrain.serve.detached import kill_all, terminate_family
from raytrain.spec.files import DEFAULT_POLICY_DIR
from raytrain.testing.fake_pods import PodServers
from raytrain.testing.imds_server import MetadataServer
from raytrain.testing.jobs import SPOT_TEST_POLICY
from raytrain.testing.ray_service import free_port, wait_for
from raytrain.testing.runpod_api import FakeRunPod

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODE_TYPES = ("cpu-spot", "cpu-on-demand")  # the service's markets of the local offer
GPU_TYPE = "NVIDIA GeForce RTX 4090"  # what the pods are bought as; they train on CPUs
HEAD_GPU_TYPE = "NVIDIA RTX A4000"  # cluster/runpod.yaml's head
STOP_GRACE_S = 10.0  # docker stop's default


class FakeCluster:
    def __init__(self, root: Path, port: int, url: str, metadata: MetadataServer,
                 runpod: FakeRunPod, pods: PodServers, laptop_env: dict[str, str]) -> None:
        self.root, self.port, self.url, self.metadata = root, port, url, metadata
        self.runpod, self.pods, self.laptop_env = runpod, pods, laptop_env
        self.started: dict[str, subprocess.Popen] = {}  # pod id: its `ray start`
        self.address = f"127.0.0.1:{port}"
        self.offers = root / "offers.yaml"  # what the service reads its offers from
        self.config = root / "cluster.yaml"
        self.token = ""  # the operator's, once the service on the head has written it
        self.took: dict[str, float] = {}  # seconds each `ray` command took, the latest
        self._probe: subprocess.Popen | None = None
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._booting = threading.Lock()  # one pod's `ray start` at a time (start_pod)

    def ray(self, *args: str, timeout_s: float = 300) -> str:
        """`ray <command> cluster.yaml <args>` from the user's machine (its own home, the key
        and RUNPOD_API_KEY there); its output, or AssertionError with it."""
        command, *rest = args
        started = time.monotonic()
        done = subprocess.run([str(BIN / "ray"), command, *(["-y"] if command in (
            "up", "down") else []), str(self.config), *rest], env=self.laptop_env,
            capture_output=True, text=True, timeout=timeout_s, cwd=self.root)
        output = done.stdout + done.stderr
        self.took[command] = time.monotonic() - started
        (self.root / f"ray-{command}.log").write_text(output)
        assert done.returncode == 0, f"ray {command} failed ({done.returncode}):\n{output[-4000:]}"
        return output

    def down(self) -> None:
        """`ray down`: then RunPod has no pod of this cluster."""
        self.ray("down", timeout_s=180)

    def close(self) -> None:
        if self._probe is not None:
            self._probe.kill()
            self._probe.wait()

    def worker_nodes(self) -> dict[str, str]:
        """Alive worker nodes: id -> node type (each carries its own type's resource)."""
        deadline = time.monotonic() + 120
        while True:
            line = self._ask_probe(min(30.0, deadline - time.monotonic()))
            if line.startswith("NODES "):
                break
            if time.monotonic() >= deadline:
                raise AssertionError(f"the cluster probe gave no node list in 120 s: {line}")
            self.close()  # silent, exited or in error: ask a new probe
        nodes = {}
        for node in json.loads(line[len("NODES "):]):
            for kind in ("cpu-spot", "cpu-on-demand"):
                if kind in node["resources"]:
                    nodes[node["id"]] = kind
        return nodes

    def _ask_probe(self, timeout_s: float) -> str:
        """One answer of the lasting probe process (started if there is none): its line, or
        why there is none."""
        if self._probe is None or self._probe.poll() is not None:
            self._answers = queue.Queue()  # no line of an earlier probe is read as this one's
            self._probe = subprocess.Popen(
                [sys.executable, "-m", "tests.support.cluster_probe", self.address],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=_lines_into, args=(self._probe.stdout, self._answers),
                             daemon=True).start()
        assert self._probe.stdin is not None
        try:
            self._probe.stdin.write("\n")
            self._probe.stdin.flush()
        except OSError as error:
            return f"the probe's stdin: {error!r}"
        try:
            line = self._answers.get(timeout=max(0.1, timeout_s))
        except queue.Empty:
            return f"no answer in {timeout_s:.0f} s"
        return "the probe exited" if line is None else line

    def worker_node_types(self) -> list[str]:
        return sorted(self.worker_nodes().values())

    def take_node(self, node_id: str) -> None:
        """The pod of this Ray node is lost with no notice (its machine gone, as a spot node
        is taken back): the node dies, and the autoscaler no longer finds the pod."""
        for pod in self.runpod.running():  # none if the autoscaler let it go first (idle)
            if pod_env(pod).get(NODE_ID_ENV) == node_id:
                self.runpod.reclaim(pod["id"])
        wait_for(lambda: node_id not in self.worker_nodes(), 60, "the node to go")

    def start_pod(self, pod: dict[str, Any]) -> None:
        """What RunPod's machine does with a new pod: the head (a public SSH port) serves SSH
        for `ray up`; a worker runs its command with its environment.

        Pods share this host, so they boot one after another (in a thread: RunPod answers
        the create at once): Ray nodes on one host name their sockets by counting the files
        already there (ray/_private/node.py), and two `ray start` at once can take the same
        name, the second raylet then aborting ("bind: Address already in use"), which the
        autoscaler sees as a node lost a few seconds after its launch."""
        if KEY_ENV in pod_env(pod) and "22/tcp" in pod["ports"]:  # only the head has the key
            env = {**os.environ, **pod_env(pod), "RAY_AUTH_MODE": "disabled",
                   "RUNPOD_POD_ID": pod["id"]}
            pod["ssh_port"] = self.pods.start(pod["id"], env, self.root / "pods" / pod["id"])
            return
        threading.Thread(target=self._boot, args=(pod,), daemon=True).start()

    def _boot(self, pod: dict[str, Any]) -> None:
        env = {**os.environ, **pod_env(pod), "RAY_AUTH_MODE": "disabled",
               "RUNPOD_POD_ID": pod["id"]}
        sockets = self.root / "ray" / "session_latest" / "sockets"
        with self._booting:
            if pod["id"] not in self.runpod.pods:
                return  # terminated before it booted
            before = set(sockets.glob("plasma_store*"))
            proc = self.started[pod["id"]] = subprocess.Popen(
                shlex.split(pod["args"]), env=env, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 60
            while set(sockets.glob("plasma_store*")) == before and proc.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.2)

    def stop_pod(self, pod: dict[str, Any], hard: bool = False) -> None:
        """A terminated pod's container is stopped as `docker stop` stops one: SIGTERM to its
        command (`ray start --block`, which stops its node), then SIGKILL to whatever is left
        after STOP_GRACE_S. A reclaimed one (`hard`) is gone at once, every process killed."""
        if pod["id"] in self.pods.servers:
            self.pods.stop(pod["id"])
            return
        proc = self.started.pop(pod["id"], None)
        if proc is None:
            return
        try:
            top = psutil.Process(proc.pid)
            found = [top, *top.children(recursive=True)]
        except psutil.Error:
            return
        if hard:
            kill_all(found)
        else:
            terminate_family(top, STOP_GRACE_S)


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
    kill_all(found)


def _lines_into(stream: Any, answers: queue.Queue) -> None:
    for line in stream:
        answers.put(line)
    answers.put(None)


@contextmanager
def started_fake_cluster(max_spot_nodes: int = 1, workers_per_node: int = 2
                         ) -> Iterator[FakeCluster]:
    """A second Ray cluster on this host, `ray up` from cluster/runpod.yaml on a fake RunPod,
    with the service on its head; the offer's nodes hold `workers_per_node` of a job's
    workers (one: a job of two spans two nodes, as replica groups do)."""
    root = Path(tempfile.mkdtemp(prefix="rtf", dir="/tmp"))  # short: Ray's socket paths
    port, http_port = free_port(), free_port()
    metadata = MetadataServer()  # every node's instance metadata service (notices)
    runpod = FakeRunPod(stock={GPU_TYPE: 8, HEAD_GPU_TYPE: 1}).__enter__()
    pods = PodServers()
    service = yaml.safe_load((REPO / "cluster/local-fake-service.yaml").read_text())
    offers = root / "offers.yaml"  # a copy: tests change prices
    shipped = yaml.safe_load((REPO / "cluster" / service["offers_file"]).read_text())
    shipped["offers"][0]["gpus_per_node"] = workers_per_node
    offers.write_text(yaml.safe_dump(shipped))
    service["offers_file"] = str(offers)
    policies = root / "policies"  # the shipped ones, and one with this tiny job's costs
    policies.mkdir()
    for shipped in DEFAULT_POLICY_DIR.glob("*.yaml"):
        (policies / shipped.name).write_text(shipped.read_text())
    (policies / f"{SPOT_TEST_POLICY['name']}.yaml").write_text(yaml.safe_dump(SPOT_TEST_POLICY))
    service["policy_dir"] = str(policies)
    service["interruption_endpoint"] = metadata.url + "/{node}"  # each node its own
    service["node_types"]["cpu-spot"]["max_nodes"] = max_spot_nodes
    (root / "service.yaml").write_text(yaml.safe_dump(service))
    laptop = root / "laptop"  # the user's machine: its home, its key
    (laptop / ".ssh").mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                    str(laptop / ".ssh" / "raytrain")], check=True)
    config = yaml.safe_load((REPO / "cluster" / "runpod.yaml").read_text())
    start = (f"exec {BIN / 'ray'} start --address=127.0.0.1:{port} --num-cpus=2 "
             "--resources='{resources}' --block")
    # A node whose machine is gone stops answering: Ray's health checks find it in about 3 s
    # here, rather than 15 s.
    head_env = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_AUTH_MODE": "disabled",
                "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
    head = config["available_node_types"]["head"]
    head["node_config"] = {**head["node_config"], "env": head_env}
    head["resources"] = {"CPU": 1}
    config.update({
        "cluster_name": "raytrain-local", "max_workers": max_spot_nodes + 1,
        "idle_timeout_minutes": 0.1,  # idle nodes go after about 6 s
        "available_node_types": {"head": head, **{
            name: {"resources": {"CPU": 2, name: 1}, "min_workers": 0,
                   "max_workers": max_spot_nodes if name == "cpu-spot" else 1,
                   "node_config": {"gpu_type_id": GPU_TYPE, "gpu_count": 1,
                                   "interruptible": False, "docker_args": start}}
            for name in NODE_TYPES}},
        "head_setup_commands": [],  # the pods share this host's installation
        "head_start_ray_commands": _here(config["head_start_ray_commands"], root, port,
                                         http_port),
    })
    config["auth"]["ssh_private_key"] = str(laptop / ".ssh" / "raytrain")
    # The provider's listing cache in proportion to this cluster's autoscaler, which updates
    # every second (AUTOSCALER_UPDATE_INTERVAL_S above) where a real one takes five.
    config["provider"].update({"api_url": runpod.url, "rest_url": runpod.rest_url,
                               "head_ip": "127.0.0.1", "use_node_id_as_ip": True,
                               "list_cache_s": 2.0})
    (root / "cluster.yaml").write_text(yaml.safe_dump(config))
    laptop_env = {**os.environ, "HOME": str(laptop), "RUNPOD_API_KEY": runpod.key,
                  "RAY_AUTH_MODE": "disabled"}
    cluster = FakeCluster(root, port, f"http://127.0.0.1:{http_port}", metadata, runpod, pods,
                          laptop_env)
    runpod.on_create, runpod.on_terminate = cluster.start_pod, cluster.stop_pod
    runpod.on_reclaim = lambda pod: cluster.stop_pod(pod, hard=True)
    try:
        cluster.up_output = cluster.ray("up", "--no-config-cache")  # type: ignore[attr-defined]
        cluster.token = read_tokens(root / "state")[OPERATOR]
        yield cluster
    finally:
        cluster.close()
        if runpod.pods:
            try:
                cluster.down()
            except (AssertionError, subprocess.SubprocessError):
                pass
        for pod in list(runpod.pods.values()):
            cluster.stop_pod(pod)
        _stop(root, port)
        pods.close()
        runpod.__exit__(None, None, None)
        metadata.close()


def _here(commands: list[str], root: Path, port: int, http_port: int) -> list[str]:
    """cluster/runpod.yaml's head start commands for a head pod on this host: Ray on a free
    port, in this cluster's folder, without its dashboard, with one CPU; the service on a
    loopback port with this cluster's offers, policies and state."""
    changes = {
        "--port=6379 --num-cpus=0": f"--port={port} --num-cpus=1 --temp-dir={root / 'ray'} "
                                    "--include-dashboard=false",
        "--address=127.0.0.1:6379 --host 0.0.0.0 --port 8000":
            f"--address=127.0.0.1:{port} --host 127.0.0.1 --port {http_port}",
        "--cluster-config ~/ray_bootstrap_config.yaml":
            f"--config {root / 'service.yaml'} --state-dir {root / 'state'}",
    }
    text = "\n".join(commands)
    for shipped, here in changes.items():
        assert shipped in text, f"cluster/runpod.yaml's head start commands lost {shipped!r}"
        text = text.replace(shipped, here)
    return text.split("\n")
