"""Each job's progress history, as the dashboard's charts draw it: one point per progress
report (time, step, loss, tokens/s, dollars spent, dollars per hour), kept in the store so a
reloaded page or a restarted service still draws the whole run.

The event stream (serve.events) keeps only its last few thousand events, in memory, for
followers; this keeps fewer, smaller values, durably, and evenly spread over the whole run.
Each point carries its report's number `n` (0, 1, 2, ...). A job keeps the reports whose
number is a multiple of its stride, and always its latest. The stride starts at 1 and doubles
whenever more than POINTS_KEPT points would be kept (`thinned`). So a week-long job's chart has
at most POINTS_KEPT points, one every `stride` reports from its first to its latest, and the
store holds no more. Reports come at most once a second: a job is thinned at most once per
POINTS_KEPT / 2 seconds. The store is written on each of the job's saves, with only what
changed since the last.

    history = History(store)
    history.add(job_id, point_of(event_data, now)); history.save(job_id)
    history.json(job_id) -> '{"job_id": ..., "points_kept": 2000, "points": [...]}'
"""

from __future__ import annotations

import json
import math
import sqlite3
from functools import reduce
from typing import Any, Mapping, Sequence

from raytrain.serve.store import JobStore

POINTS_KEPT = 2000


def thinned(numbers: Sequence[int], limit: int, stride: int) -> tuple[list[int], int]:
    """The report numbers to keep of `numbers` (ascending, the latest last) and the stride
    they keep: the multiples of the smallest stride (`stride` doubled as often as needed)
    that leaves at most `limit`, and the latest whatever its number."""
    limit = max(limit, 2)
    while True:
        kept = [n for n in numbers[:-1] if n % stride == 0] + list(numbers[-1:])
        if len(kept) <= limit:
            return kept, stride
        stride *= 2


def stride_of(numbers: Sequence[int]) -> int:
    """The stride a kept history was thinned to: the common divisor of its numbers but the
    latest's (1 for a history never thinned)."""
    return reduce(math.gcd, (n for n in numbers[:-1] if n), 0) or 1


def point_of(data: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The chart's point for a progress event's data, recorded at `now`."""
    return {"time": now, "step": int(data.get("step", 0)), "loss": data.get("loss"),
            "tokens_per_s": data.get("tokens_per_s"),
            "cost_usd": float(data.get("cost_usd") or 0.0),
            "usd_per_hour": float(data.get("usd_per_hour") or 0.0)}


class History:
    """The kept points of each job that reports, read from the store when it first reports
    (after a restart too), written back on `save` and let go once it ends. Not thread-safe:
    the job manager calls it under its lock."""

    def __init__(self, store: JobStore, limit: int = POINTS_KEPT) -> None:
        self._store = store
        self.limit = limit
        self._points: dict[str, list[dict[str, Any]]] = {}
        self._stride: dict[str, int] = {}
        self._unsaved: dict[str, dict[int, dict[str, Any]]] = {}  # by job, by number
        self._dropped: dict[str, set[int]] = {}  # numbers the store still has
        self._retry: dict[str, bool] = {}  # jobs whose save failed: released after it?

    def _of(self, job_id: str) -> list[dict[str, Any]]:
        if job_id not in self._points:
            points = [json.loads(p) for p in self._store.points(job_id)]
            self._points[job_id] = points
            self._stride[job_id] = stride_of([p["n"] for p in points])
            self._unsaved[job_id], self._dropped[job_id] = {}, set()
        return self._points[job_id]

    def add(self, job_id: str, point: dict[str, Any]) -> None:
        points = self._of(job_id)
        n = points[-1]["n"] + 1 if points else 0
        if points and points[-1]["n"] % self._stride[job_id]:
            self._drop(job_id, points.pop())  # kept only while it was the latest
        points.append({**point, "n": n})
        self._unsaved[job_id][n] = points[-1]
        if len(points) > self.limit:  # at most once per limit / 2 reports
            kept, self._stride[job_id] = thinned([p["n"] for p in points], self.limit,
                                                 self._stride[job_id])
            keep = set(kept)
            for p in points:
                if p["n"] not in keep:
                    self._drop(job_id, p)
            self._points[job_id] = [p for p in points if p["n"] in keep]

    def _drop(self, job_id: str, point: dict[str, Any]) -> None:
        self._unsaved[job_id].pop(point["n"], None)
        self._dropped[job_id].add(point["n"])

    def save(self, job_id: str, release: bool = False) -> None:
        """Write what changed of the job's points since the last save; with `release` (the
        job has ended: no more points come), drop them from memory too. A disk that does not
        take the write keeps them in memory for `retry` (serve.durable)."""
        if job_id not in self._points:
            return
        unsaved, dropped = self._unsaved[job_id], self._dropped[job_id]
        if unsaved or dropped:
            try:
                self._store.save_points(job_id, {n: json.dumps(p) for n, p in unsaved.items()},
                                        dropped)
            except sqlite3.Error:
                self._retry[job_id] = self._retry.get(job_id, False) or release
                return
            self._unsaved[job_id], self._dropped[job_id] = {}, set()
        self._retry.pop(job_id, None)
        if release:
            self.forget(job_id)

    def retry(self) -> None:
        """Save what a failing disk left unsaved."""
        for job_id, release in list(self._retry.items()):
            self.save(job_id, release)

    def json(self, job_id: str) -> str:
        """The job's history as JobHistory's JSON: from memory while the job reports, else
        read from the store (and not held: an ended job's points stay out of memory)."""
        points = self._points.get(job_id)
        if points is None:
            points = [json.loads(p) for p in self._store.points(job_id)]
        return json.dumps({"job_id": job_id, "points_kept": self.limit, "points": points})

    def forget(self, job_id: str) -> None:
        """Drop a job's points from memory (a deleted job's go from the store with its
        record)."""
        for kept in (self._points, self._stride, self._unsaved, self._dropped, self._retry):
            kept.pop(job_id, None)
