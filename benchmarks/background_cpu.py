"""Where the CPU goes while a raytrain job trains: CPU-seconds per process over a window.

Throughput on a shared 2-core machine swings by 10% between runs; CPU time does not. This
runs the dp_throughput workload through the service, lets it reach steady state, then reads
every process's CPU time twice, `--window` seconds apart, and prints the training workers'
share against everything else (Ray, Serve, the job manager, the following client), and,
inside the training workers, the training thread against Ray's own threads there.
`--torchrun` reads the same window over benchmarks/torchrun_ddp.py's two ranks instead. Both
print the CPU-ms the training processes spend per step, to tell a smaller share of the
machine from a costlier step.

    python -m benchmarks.background_cpu --window 20 [--torchrun]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from benchmarks.dp_throughput import job_document
from raytrain.client import Client
from raytrain.serve.deploy import connect_ray, deploy, undeploy
from raytrain.serve.http.auth import operator_token
from raytrain.spec import ServiceConfig


def cpu_seconds_by_process() -> dict[int, tuple[str, float]]:
    seen = {}
    for proc in psutil.process_iter(["pid", "cmdline", "name"]):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        cmdline = " ".join(proc.info["cmdline"] or []) or proc.info["name"] or "?"
        label = cmdline.split()[0]
        label = label if label.startswith("ray::") else label.split("/")[-1]
        seen[proc.info["pid"]] = (label, times.user + times.system)
    return seen


def cpu_seconds_by_worker_thread() -> dict[tuple[int, int], tuple[str, float]]:
    """CPU-seconds of every thread of the training workers, by (pid, tid), with its name."""
    seen = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if not " ".join(proc.info["cmdline"] or []).startswith("ray::RayTrainWorker"):
            continue
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:
                name = open(f"/proc/{proc.pid}/task/{thread.id}/comm").read().strip()
            except OSError:
                continue
            seen[(proc.pid, thread.id)] = (name, thread.user_time + thread.system_time)
    return seen


def torchrun_share(window: float, steps: int) -> None:
    """The reference's two ranks: their CPU time over the window, after 12 s of warm-up, and
    the steps rank 0 stamped inside it (read from its output once the run ends)."""
    script = os.path.join(os.path.dirname(__file__), "torchrun_ddp.py")
    with tempfile.TemporaryDirectory() as tmp:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_port", "29533", script, "--steps", str(steps), "--out", f"{tmp}/t.json"],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(12)

            def ranks() -> dict[int, float]:
                seen = {}
                for child in psutil.Process(launcher.pid).children(recursive=True):
                    try:
                        times = child.cpu_times()
                    except psutil.Error:
                        continue
                    seen[child.pid] = times.user + times.system
                return seen

            before, started, wall_start = ranks(), time.monotonic(), time.time()
            time.sleep(window)
            after, elapsed, wall_end = ranks(), time.monotonic() - started, time.time()
            launcher.wait()
            stamps = json.loads(Path(tmp, "t.json").read_text())["step_times"]
        finally:
            if launcher.poll() is None:
                launcher.terminate()
                launcher.wait()
    if stamps[-1] < wall_end:
        sys.exit(f"the reference finished inside the window; raise --torchrun-steps above {steps}")
    done = sum(wall_start <= stamp < wall_end for stamp in stamps)
    used = sum(cpu - before[pid] for pid, cpu in after.items() if pid in before)
    capacity = elapsed * (os.cpu_count() or 1)
    print(f"torchrun ranks {used:6.2f} CPU-s of {capacity:.1f} ({used / capacity:.1%} of capacity)")
    print(f"steps in the window {done}: {used / done * 1000:.1f} CPU-ms per step")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=8775)
    parser.add_argument("--torchrun", action="store_true")
    parser.add_argument("--torchrun-steps", type=int, default=1500,
                        help="the reference's run length; it must outlast the window")
    args = parser.parse_args()
    if args.torchrun:
        torchrun_share(args.window, args.torchrun_steps)
        return
    connect_ray(None, num_cpus=2, quiet=True)
    with tempfile.TemporaryDirectory() as state_dir:
        config = ServiceConfig(state_dir=state_dir)
        url = deploy(config, "127.0.0.1", args.port)
        client = Client(url, token=operator_token(config))
        job = client.submit(job_document(100_000))
        follower = threading.Thread(target=lambda: [None for _ in job.events()], daemon=True)
        follower.start()  # progress reporting on, and someone watching it, as a user would
        while job.status().progress.step < 50:
            time.sleep(0.5)
        threads_before = cpu_seconds_by_worker_thread()
        step_before = job.status().progress.step
        before, started = cpu_seconds_by_process(), time.monotonic()
        time.sleep(args.window)
        after, elapsed = cpu_seconds_by_process(), time.monotonic() - started
        step_after = job.status().progress.step
        threads_after = cpu_seconds_by_worker_thread()
        job.cancel()
        undeploy(stop_jobs=True)
    by_label: dict[str, float] = defaultdict(float)
    for pid, (label, cpu) in after.items():
        if pid in before:
            by_label[label] += cpu - before[pid][1]
    capacity = elapsed * (os.cpu_count() or 1)
    workers = by_label.pop("ray::RayTrainWorker", 0.0)
    print(f"window {elapsed:.1f} s x {os.cpu_count()} CPUs = {capacity:.1f} CPU-s")
    print(f"training workers {workers:6.2f} CPU-s ({workers / capacity:.1%} of capacity)")
    done = step_after - step_before  # progress lags a step by < 2 s at either end alike
    print(f"steps in the window {done}: {workers / done * 1000:.1f} CPU-ms per step")
    rest = sum(by_label.values())
    print(f"everything else  {rest:6.2f} CPU-s ({rest / capacity:.1%} of capacity), of which:")
    for label, cpu in sorted(by_label.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {cpu:6.2f}  {label}")
    by_thread: dict[str, float] = defaultdict(float)
    for key, (name, cpu) in threads_after.items():
        if key in threads_before:
            by_thread[name] += cpu - threads_before[key][1]
    print("inside the training workers, by thread name (both workers):")
    for name, cpu in sorted(by_thread.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {cpu:6.2f}  {name}")


if __name__ == "__main__":
    main()
