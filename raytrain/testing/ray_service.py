"""The real service on a local Ray, for tests and benchmarks: its client, the demo-sized job
spec, waits with ceilings, Ray Train's worker processes, and a one-process reference run."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any, Callable

import httpx
import psutil
import ray

NUM_CPUS = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_worker_pids() -> list[int]:
    """PIDs of live Ray Train worker processes on this machine."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if cmdline.startswith("ray::RayTrainWorker"):
            pids.append(proc.info["pid"])
    return pids


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def reference_run(spec: Any, root: Path) -> Any:
    """The job trained in this process, on one thread (the RecordingSink of
    tests/support/runs.run_single): it runs beside the cluster's ranks on this
    machine's two cores, where two threads more would stall their collectives (a test 12 s
    slower)."""
    import torch

    from raytrain.testing.runs import run_single

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_single(spec, root)
    finally:
        torch.set_num_threads(threads)


class Service:
    def __init__(self, url: str, state_dir: Path, token: str | None = None) -> None:
        self.url = url
        self.state_dir = state_dir
        self.token = token
        # Raw HTTP with the operator's token; the Client and the CLI read RAYTRAIN_TOKEN.
        self.http = httpx.Client(timeout=60.0, headers={"Authorization": f"Bearer {token}"}
                                 if token else {})


def job_spec(steps: int, checkpoint_every: int = 50, name: str = "itest") -> dict[str, Any]:
    return {
        "name": name,
        "model": {"gpt": {"vocab_size": 128, "dim": 64, "num_layers": 2, "num_heads": 4,
                          "max_seq_len": 32}},
        "data": {"seq_len": 32},
        "training": {"steps": steps, "global_batch_size": 16, "micro_batch_size": 4,
                     "checkpoint_every_steps": checkpoint_every, "learning_rate": 0.01},
        "resources": {"num_workers": 2, "cpus_per_worker": 1},
    }


def cpus_free() -> float:
    return ray.available_resources().get("CPU", 0.0)


def cancel_what_is_left(service: Service) -> None:
    from raytrain import Client
    from raytrain.errors import JobStateError

    with Client(service.url, token=service.token) as client:
        for job in client.list():
            if not job.state.is_terminal:
                try:
                    client.cancel(job.id)
                except JobStateError:
                    pass  # it ended meanwhile
