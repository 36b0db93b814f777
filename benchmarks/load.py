"""HTTP load on the service, beside a plain FastAPI app serving the same JSON in the same run.

    python -m benchmarks.load [--seconds 20] [--connections 16] [--streams 50]

Starts a local Ray cluster and the service (state in a temporary folder) on 127.0.0.1, and a
plain FastAPI + uvicorn app in its own process answering the same job status. Each figure is
a closed loop of `--connections` keep-alive connections for `--seconds`:
- /healthz, GET /v1/jobs/{id}, GET /v1/jobs with 100 jobs, and the plain app: requests/s,
  p50 and p99;
- the demo job's training throughput unloaded, then under the readers, then unloaded again,
  and the CPU seconds the load client itself spent meanwhile;
- `--streams` event streams open on the training job: how late their progress events come
  (from the report's sent_at to the stream's arrival);
- the same app in one process with its job manager (on the fake cluster of the tests), to
  tell the app's own cost from that of the actor calls behind it.

The client is a minimal HTTP/1.1 client on asyncio streams (a request and a response parsed by
hand), since a general client (httpx) spends more CPU per request than the service it would
measure on these 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


async def _one_connection(host: str, port: int, request: bytes, until: float,
                          latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while time.perf_counter() < until:
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            if head[9:12] != b"200":
                raise RuntimeError(f"status {head[9:12].decode()} from {request[:60]!r}")
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


def closed_loop(url: str, path: str, token: str | None, connections: int,
                seconds: float) -> dict[str, float]:
    """`connections` keep-alive connections sending GET `path` back to back for `seconds`."""
    host, port = url.removeprefix("http://").split(":")
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}\r\n".encode()
    latencies: list[float] = []

    async def run() -> None:
        until = time.perf_counter() + seconds
        await asyncio.gather(*(_one_connection(host, int(port), request, until, latencies)
                               for _ in range(connections)))

    started = time.perf_counter()
    asyncio.run(run())
    wall = time.perf_counter() - started
    ordered = sorted(latencies)
    return {"rps": len(ordered) / wall, "p50_ms": 1000 * ordered[len(ordered) // 2],
            "p99_ms": 1000 * ordered[int(len(ordered) * 0.99)]}


def stream_lag(url: str, job_id: str, token: str | None, streams: int,
               seconds: float) -> dict[str, float]:
    """Open `streams` event streams on a job; how late each progress event arrives."""
    import httpx

    lags: list[float] = []
    counts: list[int] = []

    opened = time.time()

    async def follow(client: httpx.AsyncClient) -> None:
        seen = 0
        try:
            async with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        sent = event["data"].get("sent_at", 0.0)
                        if event["type"] == "progress" and sent > opened:  # not the history
                            lags.append(time.time() - sent)
                            seen += 1
        finally:
            counts.append(seen)

    async def run() -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        limits = httpx.Limits(max_connections=streams + 4)
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=None,
                                     limits=limits) as client:
            tasks = [asyncio.create_task(follow(client)) for _ in range(streams)]
            await asyncio.sleep(seconds)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    ordered = sorted(lags) or [float("nan")]
    return {"streams": streams, "events_min": min(counts), "events_max": max(counts),
            "lag_p50_ms": 1000 * ordered[len(ordered) // 2],
            "lag_p99_ms": 1000 * ordered[int(len(ordered) * 0.99)]}


PLAIN_APP = """
import json, sys
from fastapi import FastAPI
from fastapi.responses import Response
import uvicorn
body = open(sys.argv[1], "rb").read()
app = FastAPI()
@app.get("/job")
async def job() -> Response:
    return Response(body, media_type="application/json")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""


def tokens_per_s(client: Any, job_id: str, seconds: float) -> float:
    """The job's mean reported throughput over `seconds` (sampled each second)."""
    samples = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(1.0)
        rate = client.get(job_id).progress.tokens_per_s
        if rate:
            samples.append(rate)
    return statistics.fmean(samples)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--streams", type=int, default=50)
    args = parser.parse_args()

    import httpx

    from benchmarks import local_service
    from raytrain.client import Client
    from raytrain.spec import load_job_spec
    from raytrain.testing.http_service import free_port, served
    from raytrain.testing.ray_service import job_spec

    url, token, state = local_service.start("raytrain-load-")
    client = Client(url, token=token)
    n, secs = args.connections, args.seconds
    rows: list[tuple[str, dict[str, float]]] = []

    demo = load_job_spec(Path(__file__).parents[1] / "raytrain" / "examples" / "demo.yaml")
    demo = demo.model_copy(update={"training": demo.training.model_copy(
        update={"steps": 100_000})})
    job = client.submit(demo)
    while client.get(job.id).progress.step < 5:
        time.sleep(1)
    body = Path(state / "job.json")
    body.write_bytes(httpx.get(f"{url}/v1/jobs/{job.id}",
                               headers={"Authorization": f"Bearer {token}"}).content)
    plain_port = free_port()
    plain = subprocess.Popen([sys.executable, "-c", PLAIN_APP, str(body), str(plain_port)])
    try:
        time.sleep(3)
        # training, unloaded and under the readers
        before = tokens_per_s(client, job.id, secs)
        sampled: list[float] = []
        sampler = threading.Thread(target=lambda: sampled.append(tokens_per_s(
            Client(url, token=token), job.id, secs - 1)))
        cpu = cpu_s()
        loaded_started = time.monotonic()
        sampler.start()
        rows.append(("GET /v1/jobs/{id} while the demo trains",
                     closed_loop(url, f"/v1/jobs/{job.id}", token, n, secs)))
        client_share = (cpu_s() - cpu) / (time.monotonic() - loaded_started)
        sampler.join()
        during = sampled[0]
        after = tokens_per_s(client, job.id, secs)
        rows.append((f"{args.streams} event streams on the training job",
                     stream_lag(url, job.id, token, args.streams, secs)))
        client.cancel(job.id)
        while not client.get(job.id).state.is_terminal:
            time.sleep(1)
        time.sleep(5)  # its workers gone: the rest is measured on an idle cluster
        rows.append(("plain FastAPI + uvicorn, same JSON",
                     closed_loop(f"http://127.0.0.1:{plain_port}", "/job", None, n, secs)))
        rows.append(("/healthz", closed_loop(url, "/healthz", token, n, secs)))
        with served(state / "no-serve") as (direct, direct_token):
            direct_job = Client(direct, token=direct_token).submit(demo).id
            rows.append(("GET /v1/jobs/{id}, the same app in one process with its job "
                         "manager (fake cluster)",
                         closed_loop(direct, f"/v1/jobs/{direct_job}", direct_token, n, secs)))
        rows.append(("GET /v1/jobs/{id}",
                     closed_loop(url, f"/v1/jobs/{job.id}", token, n, secs)))
        for i in range(99):
            client.cancel(client.submit(job_spec(steps=10, name=f"list-{i}")).id)
        rows.append(("GET /v1/jobs with 100 jobs",
                     closed_loop(url, "/v1/jobs", token, n, secs)))
        rows.append(("plain FastAPI + uvicorn, again",
                     closed_loop(f"http://127.0.0.1:{plain_port}", "/job", None, n, secs)))
    finally:
        plain.terminate()
        local_service.stop()

    plain_rps = statistics.fmean(r["rps"] for name, r in rows if name.startswith("plain"))
    print(f"\n{n} connections, {secs:.0f} s closed loops, client on the same machine "
          f"({os.cpu_count()} cores); job status {body.stat().st_size} bytes")
    print("| target | req/s | x plain | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for name, r in rows:
        if "rps" in r:
            print(f"| {name} | {r['rps']:.0f} | {r['rps'] / plain_rps:.2f} | "
                  f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} |")
    for name, r in rows:
        if "streams" in r:
            print(f"{name}: each got {r['events_min']}-{r['events_max']} progress events; "
                  f"lag p50 {r['lag_p50_ms']:.0f} ms, p99 {r['lag_p99_ms']:.0f} ms")
    # against both unloaded windows: this machine's speed drifts from one to the next
    print(f"demo tokens/s: unloaded {before:.0f}, under {n} readers {during:.0f}, unloaded "
          f"after {after:.0f}: {2 * during / (before + after):.2f}x the unloaded mean; the load "
          f"client used {client_share:.2f} CPU cores meanwhile")


if __name__ == "__main__":
    main()
