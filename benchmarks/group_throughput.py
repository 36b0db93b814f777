"""Training speed while a replica group is missing, against the share the survivors should
keep: the same job's steps per second with every group training, after one leaves on a
notice (the survivors take its micro-batches), and after a replacement heals from a live
group and joins.

    python -m benchmarks.group_throughput [--groups 2 3] [--window-s 20]

Each group is one process of one worker (raytrain/testing/elastic_groups.py: torchft's Manager over
gloo, a Lighthouse in this process), one thread each. The job does the same work per step
whatever the number of groups (its global batch), so with G groups and one gone the
survivors should keep (G - 1) / G of the steps per second if each group had a core of its
own; on a machine with fewer cores than groups, each group's share of the cores grows as one
leaves, so the share expected here is min(G - 1, cores) / min(G, cores). A window is the
steps the groups trained in --window-s seconds, from the leading group's records, skipping
the two steps after each change.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from raytrain.testing.elastic_groups import group_main, step_times, wait_for_event, wait_for_step

os.environ.setdefault("RUST_LOG", "error")  # before torchft's Lighthouse logs at INFO

JOB = {"name": "throughput",
       "model": {"gpt": {"vocab_size": 256, "dim": 128, "num_layers": 4, "num_heads": 4,
                         "max_seq_len": 64}},
       "data": {"seq_len": 64},
       "training": {"steps": 100_000, "global_batch_size": 24, "micro_batch_size": 2,
                    "checkpoint_every_steps": 1_000_000, "learning_rate": 0.001},
       "resources": {"num_workers": 1}}


def steps_per_s(folder: Path, group: int, after: float, window_s: float) -> tuple[float, float]:
    """Steps per second `group` trained in the window after its third step past `after`,
    and the time the window ended."""
    times = [at for _, at in step_times(folder, group) if at > after][2:]
    deadline = time.monotonic() + window_s + 120
    while not times or times[-1] - times[0] < window_s:
        assert time.monotonic() < deadline, "the groups stopped training"
        time.sleep(0.2)
        times = [at for _, at in step_times(folder, group) if at > after][2:]
    inside = [at for at in times if at <= times[0] + window_s]
    return (len(inside) - 1) / (inside[-1] - inside[0]), inside[-1]


def measure(groups: int, window_s: float) -> dict[str, float]:
    from torchft.coordination import LighthouseServer

    folder = Path(tempfile.mkdtemp(prefix="group-throughput-"))
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=200,
                                  heartbeat_timeout_ms=1500)
    context = multiprocessing.get_context("spawn")
    processes: dict[int, Any] = {}
    for group in range(groups + 1):  # the last one is the replacement
        processes[group] = context.Process(
            target=partial(group_main, job=JOB, groups=groups + 1),
            args=(group, lighthouse.address(), str(folder)), daemon=True)
        processes[group].start()
    try:
        for group in range(groups):
            (folder / f"start-{group}").touch()
        wait_for_step(folder, 3, timeout_s=300)
        while len({s for s, _ in step_times(folder, 0)} &
                   {s for s, _ in step_times(folder, groups - 1)}) < 2:
            time.sleep(0.1)  # every group in the quorum
        full, ended = steps_per_s(folder, 0, time.time(), window_s)
        (folder / f"notice-{groups - 1}").touch()
        wait_for_event(folder, groups - 1, "gone")
        fewer, ended = steps_per_s(folder, 0, time.time(), window_s)
        (folder / f"start-{groups}").touch()
        wait_for_event(folder, groups, "training", timeout_s=300)
        again, _ = steps_per_s(folder, 0, time.time(), window_s)
    finally:
        for process in processes.values():
            if process.is_alive():
                process.kill()
        lighthouse.shutdown()
    cores = os.cpu_count() or 1
    expected = min(groups - 1, cores) / min(groups, cores)
    return {"groups": groups, "full": full, "fewer": fewer, "again": again,
            "expected": expected, "cores": cores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--window-s", type=float, default=20.0)
    args = parser.parse_args()
    print("| groups | steps/s, all | one gone | share kept | expected here | "
          "kept / expected | a replacement joined |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for groups in args.groups:
        r = measure(groups, args.window_s)
        kept = r["fewer"] / r["full"]
        print(f"| {groups} | {r['full']:.2f} | {r['fewer']:.2f} | {kept:.3f} | "
              f"{r['expected']:.3f} ({r['cores']} cores) | {kept / r['expected']:.3f} | "
              f"{r['again']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
