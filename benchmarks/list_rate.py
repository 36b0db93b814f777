"""A page of 100 jobs from GET /v1/jobs against a plain app serving the same JSON, side by
side in one run.

    python -m benchmarks.list_rate [--seconds 10] [--connections 16]

The service's app with its job manager in one process of its own, as a replica is (the
recording fake of Ray, as raytrain/testing/http_service.py serves it: uvicorn on a thread, status
reads
and list pages from memory), holds 114 jobs; GET /v1/jobs answers its default page (100).
The plain FastAPI + uvicorn app (benchmarks.load's) answers the bytes of that same page from
a file, in its own process too. The load comes from this process. Printed: requests/s, the
ratio, p50 and p99, for each in closed loops (benchmarks.load).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.load import PLAIN_APP, closed_loop
from raytrain.testing.http_service import free_port
from raytrain.testing.ray_service import job_spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        service = subprocess.Popen([sys.executable, "-c", SERVICE, str(Path(root) / "state")],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            url, token = service.stdout.readline().split()  # type: ignore[union-attr]
            size, rows = measure(url, token, Path(root), args.connections, args.seconds)
        finally:
            service.terminate()
            service.wait(30)
    plain_rps = (rows[0][1]["rps"] + rows[2][1]["rps"]) / 2
    print(f"page {size} bytes; {args.connections} connections, "
          f"{args.seconds:.0f} s closed loops")
    print("| target | req/s | x plain | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['rps']:.0f} | {r['rps'] / plain_rps:.2f} | {r['p50_ms']:.0f} | "
              f"{r['p99_ms']:.0f} |")


SERVICE = """
import sys, time
from pathlib import Path
from raytrain.testing.http_service import served
with served(Path(sys.argv[1])) as (url, token):
    print(url, token, flush=True)
    sys.stdin.read()  # until the benchmark ends
"""


def measure(url: str, token: str, root: Path, connections: int, seconds: float
            ) -> tuple[int, list[tuple[str, dict[str, float]]]]:
    """Fill the service with 114 jobs, then the three closed loops; the page's size."""
    headers = {"Authorization": f"Bearer {token}"}
    for i in range(114):
        httpx.post(f"{url}/v1/jobs", json=job_spec(steps=10, name=f"list-{i}"),
                   headers=headers).raise_for_status()
    page = httpx.get(f"{url}/v1/jobs", headers=headers)
    assert len(page.json()) == 100 and "x-next-cursor" in page.headers
    body = root / "page.json"
    body.write_bytes(page.content)
    port = free_port()
    plain = subprocess.Popen([sys.executable, "-c", PLAIN_APP, str(body), str(port)])
    try:
        time.sleep(3)
        rows = [("plain FastAPI + uvicorn, the same page",
                 closed_loop(f"http://127.0.0.1:{port}", "/job", None, connections,
                             seconds)),
                ("GET /v1/jobs (a page of 100 of 114 jobs)",
                 closed_loop(url, "/v1/jobs", token, connections, seconds)),
                ("plain, again", closed_loop(f"http://127.0.0.1:{port}", "/job", None,
                                             connections, seconds))]
    finally:
        plain.terminate()
    return len(page.content), rows


if __name__ == "__main__":
    main()
