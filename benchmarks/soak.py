"""A soak of the service on this machine: mixed API requests while small jobs are submitted
and cancelled at random points, bounded in count and time, on 127.0.0.1 only.

    python -m benchmarks.soak [--requests 20000] [--jobs 200] [--max-s 900] [--seed 0]

Starts its own local Ray cluster and service (state in a temporary folder). Request threads
send a fixed mix (health, readiness, one job, a page of jobs, offers, a job's logs, a bad
spec that must answer 422); a job thread submits small 2-worker jobs and, for each, draws
where to cancel it: while queued, while its worker group starts, after its first step, or
not at all. It prints, per tenth of the requests, the p50 and p99 latency and the job
manager's and the HTTP replica's memory (RSS); then how the jobs ended, the HTTP statuses
seen, and the placement groups left once every job has ended (must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import threading
import time
from collections import Counter

import httpx
import psutil

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

MIX = ("healthz", "readyz", "job", "list", "offers", "logs", "bad")
CANCEL_AT = (("queued", 0.4), ("starting", 0.2), ("first-step", 0.25), ("never", 0.15))


def rss_mib(prefix: str) -> float | None:
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        if " ".join(proc.info.get("cmdline") or []).startswith(prefix):
            return proc.info["memory_info"].rss / 2**20
    return None


def small_job(steps: int, name: str) -> dict:
    return {"name": name, "model": {"gpt": {"vocab_size": 128, "dim": 64, "num_layers": 2,
                                            "num_heads": 4, "max_seq_len": 32}},
            "data": {"seq_len": 32},
            "training": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 4,
                         "checkpoint_every_steps": 10},
            "resources": {"num_workers": 2, "cpus_per_worker": 0.5}}


class Soak:
    def __init__(self, url: str, seed: int, token: str | None) -> None:
        self.url = url
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.latencies: list[tuple[float, str, float]] = []  # (time, kind, seconds)
        self.statuses: Counter[str] = Counter()
        self.job_ids: list[str] = []
        self.cancel_points: Counter[str] = Counter()

    def request(self, http: httpx.Client, kind: str) -> None:
        with self.lock:
            job_id = self.rng.choice(self.job_ids) if self.job_ids else "none"
        started = time.perf_counter()
        if kind == "healthz":
            answer = http.get("/healthz")
        elif kind == "readyz":
            answer = http.get("/readyz")
        elif kind == "job":
            answer = http.get(f"/v1/jobs/{job_id}")
        elif kind == "list":
            answer = http.get("/v1/jobs", params={"limit": 20})
        elif kind == "offers":
            answer = http.get("/v1/offers")
        elif kind == "logs":
            answer = http.get(f"/v1/jobs/{job_id}/logs", params={"max_bytes": 4096})
        else:
            answer = http.post("/v1/jobs", json={"training": {"steps": -1}})
        elapsed = time.perf_counter() - started
        with self.lock:
            self.latencies.append((time.time(), kind, elapsed))
            self.statuses[f"{kind} {answer.status_code}"] += 1

    def requests(self, count: int, deadline: float, threads: int = 4) -> None:
        remaining = iter(range(count))
        take = threading.Lock()

        def worker() -> None:
            with httpx.Client(base_url=self.url, timeout=30.0, headers=self.headers) as http:
                while time.monotonic() < deadline:
                    with take:
                        if next(remaining, None) is None:
                            return
                    self.request(http, MIX[self.rng.randrange(len(MIX))])

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    def jobs(self, count: int, deadline: float) -> None:
        from raytrain.client import Client

        client = Client(self.url, token=self.token)
        for i in range(count):
            if time.monotonic() > deadline:
                break
            point = self.rng.choices([p for p, _ in CANCEL_AT], [w for _, w in CANCEL_AT])[0]
            job = client.submit(small_job(20 if point == "never" else 100_000, f"soak-{i}"))
            with self.lock:
                self.job_ids.append(job.id)
                self.cancel_points[point] += 1
            if point == "never":
                continue
            wanted = {"queued": None, "starting": "PROVISIONING", "first-step": "RUNNING"}[point]
            until = time.monotonic() + 120
            while wanted is not None and time.monotonic() < until:
                status = job.status()
                if status.state.value == wanted and (point != "first-step"
                                                     or status.progress.step > 0):
                    break
                if status.state.is_terminal:
                    break
                time.sleep(0.2)
            try:
                job.cancel()
            except Exception:  # noqa: BLE001 - already ended
                pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--max-s", type=float, default=900.0, help="stop sending after this")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import ray

    from benchmarks import local_service
    from raytrain.client import Client

    url, token, _ = local_service.start("raytrain-soak-")
    soak = Soak(url, args.seed, token)
    started = time.monotonic()
    deadline = started + args.max_s
    memory = [("start", rss_mib("ray::StartedJobManager"), rss_mib("ray::ServeReplica"))]
    job_thread = threading.Thread(target=soak.jobs, args=(args.jobs, deadline))
    job_thread.start()
    tenth = max(1, args.requests // 10)
    for part in range(10):
        soak.requests(tenth, deadline)
        memory.append((f"{(part + 1) * 10}%", rss_mib("ray::StartedJobManager"),
                       rss_mib("ray::ServeReplica")))
    job_thread.join()
    client = Client(url, token=soak.token)
    for job in client.list():  # what the job thread left running
        if not job.state.is_terminal:
            client.cancel(job.id)
    ends = time.monotonic() + 300
    while time.monotonic() < ends and any(not j.state.is_terminal for j in client.list()):
        time.sleep(1)
    # A cancelled group has CANCEL_GRACE_S to leave once it runs (one still starting is
    # stopped at once); then the manager removes it. Wait that long at most, and say how
    # long it took: a group still there after that is a leak.
    from raytrain.core.lifecycle import CANCEL_GRACE_S

    def live_groups() -> list[str]:
        return [g for g, info in ray.util.placement_group_table().items()
                if info["state"] != "REMOVED"]

    all_ended = time.monotonic()
    give_up = all_ended + CANCEL_GRACE_S + 60
    while live_groups() and time.monotonic() < give_up:
        time.sleep(1)
    leaked = live_groups()
    print(f"placement groups gone {time.monotonic() - all_ended:.0f} s after every job ended"
          if not leaked else f"placement groups still held {give_up - all_ended:.0f} s after "
          "every job ended")
    ended = Counter(job.state.value for job in client.list())
    memory.append(("end", rss_mib("ray::StartedJobManager"), rss_mib("ray::ServeReplica")))
    wall = time.monotonic() - started
    local_service.stop()

    lat = soak.latencies
    print(f"requests: {len(lat)} in {wall:.0f} s; jobs submitted: {len(soak.job_ids)}; "
          f"cancel points: {dict(soak.cancel_points)}")
    print("window  requests  p50 ms  p99 ms  manager MiB  replica MiB")
    t0, t1 = lat[0][0], lat[-1][0]
    for i in range(10):
        lo, hi = t0 + (t1 - t0) * i / 10, t0 + (t1 - t0) * (i + 1) / 10
        window = sorted(s for t, _, s in lat if lo <= t <= hi)
        if window:
            p50 = statistics.median(window) * 1000
            p99 = window[min(len(window) - 1, int(0.99 * len(window)))] * 1000
            _, manager, replica = memory[i + 1]
            print(f"{i + 1:>6}  {len(window):>8}  {p50:>6.0f}  {p99:>6.0f}  "
                  f"{manager or 0:>11.0f}  {replica or 0:>11.0f}")
    print("memory (MiB), manager / replica:",
          ", ".join(f"{w} {m or 0:.0f}/{r or 0:.0f}" for w, m, r in memory))
    print("jobs ended:", dict(ended))
    print("HTTP statuses:", dict(sorted(soak.statuses.items())))
    print("5xx answers:", sum(n for k, n in soak.statuses.items() if k.split()[1][0] == "5"))
    print("placement groups left:", len(leaked))
    print(json.dumps({"requests": len(lat), "wall_s": wall, "jobs": len(soak.job_ids),
                      "ended": ended, "leaked_placement_groups": len(leaked),
                      "memory_mib": memory}, default=str))


if __name__ == "__main__":
    main()
