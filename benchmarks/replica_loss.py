"""What clients see when the HTTP replica is killed (kill -9), with one replica and with two.

    python -m benchmarks.replica_loss [--replicas 1 2] [--watch-s 40]

For each replica count it starts a local Ray cluster and the service on 127.0.0.1, then reads
one job's status in a loop (a plain request each 50 ms, 30 s timeout) and, beside it, through
raytrain's Client (which retries reads with backoff). It kills one replica's process and
prints for the next --watch-s seconds: requests that failed and how, the slowest answer, how
long until answers came normally again, and the longest a Client read took.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import httpx
import psutil

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def replica_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if " ".join(p.info.get("cmdline") or []).startswith("ray::ServeReplica")]


def watch(url: str, token: str, job_id: str, seconds: float, replicas: int) -> None:
    from raytrain.client import Client

    headers = {"Authorization": f"Bearer {token}"}
    plain: list[tuple[float, float, str]] = []  # (sent, seconds, outcome)
    client_reads: list[float] = []
    stop = time.monotonic() + seconds

    def reads() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            while time.monotonic() < stop:
                sent = time.monotonic()
                try:
                    outcome = str(http.get(f"/v1/jobs/{job_id}").status_code)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                plain.append((sent, time.monotonic() - sent, outcome))
                time.sleep(0.05)

    def client_loop() -> None:
        client = Client(url, token=token)
        while time.monotonic() < stop:
            sent = time.monotonic()
            client.get(job_id)
            client_reads.append(time.monotonic() - sent)
            time.sleep(0.05)

    threads = [threading.Thread(target=reads), threading.Thread(target=client_loop)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    victim = replica_pids()[0]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    for thread in threads:
        thread.join()
    after = [(t - killed, s, o) for t, s, o in plain if t + s >= killed]
    failed = [o for _, _, o in after if o != "200"]
    slow = [(t, s) for t, s, o in after if s > 1.0 or o != "200"]
    normal_from = max((t + s for t, s in slow), default=0.0)
    print(f"{replicas} replica(s): after kill -9 of one, {len(after)} plain reads: "
          f"{len(failed)} failed ({', '.join(sorted(set(failed))) or 'none'}), slowest "
          f"{max(s for _, s, _ in after):.1f} s, answers normal again {normal_from:.1f} s "
          f"after the kill; the Client's longest read {max(client_reads):.1f} s, none failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--watch-s", type=float, default=40.0)
    args = parser.parse_args()

    from benchmarks import local_service
    from raytrain.client import Client
    from raytrain.testing.ray_service import job_spec

    for replicas in args.replicas:
        url, token, _ = local_service.start("raytrain-replica-loss-", http_replicas=replicas)
        client = Client(url, token=token)
        job = client.submit(job_spec(steps=10))
        client.cancel(job.id)
        try:
            watch(url, token, job.id, args.watch_s, replicas)
        finally:
            local_service.stop()


if __name__ == "__main__":
    main()
