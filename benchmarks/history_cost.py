"""What a job's chart history costs the job manager: 100,000 progress reports into one job's
History (serve.jobs.history) with a save every fifth, as the manager saves a running job every few
reports; then the size of what GET /v1/jobs/{id}/history answers.

    python -m benchmarks.history_cost
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from raytrain.serve.jobs.history import History, point_of
from raytrain.serve.jobs.store import JobStore

REPORTS = 100_000


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        store = JobStore(Path(root) / "jobs.db")
        history = History(store)
        started = time.perf_counter()
        for i in range(REPORTS):
            history.add("job", point_of({"step": i, "loss": 1.0 / (i + 1), "tokens_per_s": 1e4,
                                         "cost_usd": i * 1e-3, "usd_per_hour": 2.72},
                                        1.8e9 + i))
            if i % 5 == 0:
                history.save("job")
        per_report_us = 1e6 * (time.perf_counter() - started) / REPORTS
        history.save("job")
        text = history.json("job")
        points = json.loads(text)["points"]
        print(f"{REPORTS:,} reports: {per_report_us:.0f} us each (add, and a save every 5th)")
        print(f"kept {len(points):,} points, one every {points[1]['n'] - points[0]['n']} "
              f"reports; the answer is {len(text) / 1024:.0f} KiB; the store holds "
              f"{len(store.points('job')):,} rows")


if __name__ == "__main__":
    main()
