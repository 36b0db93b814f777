"""CPU an idle service takes: a local Ray cluster with the service deployed and no job, every
process's CPU time (this one's excepted) sampled with psutil over a window.

    python -m benchmarks.idle_cluster_cpu [--settle-s 20] [--window-s 30] [--port 18931]

What the integration tests' service costs the unit tests when it runs beside them
(tests/service/ray/conftest.py stops it when the integration package ends).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import psutil


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle-s", type=float, default=20.0)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--port", type=int, default=18931)
    args = parser.parse_args(argv)

    import ray

    from raytrain.serve.deploy import connect_ray, deploy, undeploy
    from raytrain.spec import ServiceConfig

    cores = os.cpu_count() or 2
    connect_ray(None, num_cpus=cores, quiet=True)
    deploy(ServiceConfig(state_dir=tempfile.mkdtemp()), "127.0.0.1", args.port)
    try:
        time.sleep(args.settle_s)
        others = [p for p in psutil.process_iter() if p.pid != os.getpid()]
        before, began = cpu_seconds(others), time.monotonic()
        time.sleep(args.window_s)
        used, window = cpu_seconds(others) - before, time.monotonic() - began
        print(f"idle service cluster: {used:.1f} CPU-s in {window:.0f} s, "
              f"{100 * used / window / cores:.1f}% of {cores} cores")
    finally:
        undeploy(stop_jobs=True)
        ray.shutdown()


if __name__ == "__main__":
    main()
