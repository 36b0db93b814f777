"""Each job's progress history, as the dashboard's charts draw it: one point per progress
report (time, step, loss, tokens/s, dollars spent, dollars per hour, the latest validation
loss and its step), kept in the store so a
reloaded page or a restarted service still draws the whole run.

The event stream (serve.jobs.event_log) keeps only its last few thousand events, in memory, for
followers; this keeps fewer, smaller values, durably, and evenly spread over the whole run.
Each point carries its report's number `n` (0, 1, 2, ...). A job keeps the reports whose
number is a multiple of its stride, and always its latest. The stride starts at 1 and doubles
whenever more than POINTS_KEPT points would be kept (`thinned`). So a week-long job's chart has
at most POINTS_KEPT points, one every `stride` reports from its first to its latest, and the
store holds no more. Reports come at most once a second: a job is thinned at most once per
POINTS_KEPT / 2 seconds. The store is written on each of the job's saves, with only what
changed since the last.

Beside the points, every optimizer step's figures (loss, learning rate, gradient norm,
tokens), whatever the report rate: rank 0 batches the steps since its last report into the
report (`steps`, rows of [step, loss, lr, grad_norm, tokens]), and they are written with the
job's next save, in one transaction, read back in pages by step.

    history = History(store)
    history.add(job_id, point_of(event_data, now)); history.save(job_id)
    history.add_steps(job_id, payload.pop("steps", []))
    history.json(job_id) -> '{"job_id": ..., "points_kept": 2000, "points": [...], ...}'
"""

from __future__ import annotations

import json
import math
import sqlite3
from functools import reduce
from typing import Any, Mapping, Sequence

from raytrain.serve.jobs.store import JobStore

POINTS_KEPT = 2000
STEPS_PER_ANSWER = 10_000  # step rows in one history answer (more: ask again after the last)

StepRow = tuple[int, "float | None", "float | None", "float | None", "int | None"]


def step_rows(rows: Any) -> list[StepRow]:
    """A report's `steps` ([step, loss, lr, grad_norm, tokens] each) as rows; what is not
    such a row is left out (a report is the workers' word, not to be trusted blindly)."""
    def number(value: Any) -> float | None:
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) \
            else None

    out: list[StepRow] = []
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, (list, tuple)) and len(row) == 5 and isinstance(row[0], int):
            tokens = row[4] if isinstance(row[4], int) else None
            out.append((row[0], number(row[1]), number(row[2]), number(row[3]), tokens))
    return out


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
            "usd_per_hour": float(data.get("usd_per_hour") or 0.0),
            "val_loss": data.get("val_loss"), "val_step": data.get("val_step"),
            "mfu": data.get("mfu"), "balance_loss": data.get("balance_loss"),
            "expert_imbalance": data.get("expert_imbalance")}


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
        self._steps: dict[str, dict[int, StepRow]] = {}  # unsaved step rows, by job, by step

    def add_steps(self, job_id: str, rows: list[StepRow]) -> None:
        """Keep steps' rows for the job's next save (a step reported again replaces its
        row: a run resumed from a checkpoint does those steps again)."""
        if rows:
            self._steps.setdefault(job_id, {}).update((row[0], row) for row in rows)

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
        take the write keeps them in memory for `retry` (serve.jobs.durable)."""
        steps = self._steps.get(job_id)
        if steps:
            try:
                self._store.save_steps(job_id, [steps[step] for step in sorted(steps)])
                self._steps.pop(job_id, None)
            except sqlite3.Error:
                self._retry[job_id] = self._retry.get(job_id, False) or release
                return
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

    def json(self, job_id: str, after_step: int = -1,
             max_steps: int = STEPS_PER_ANSWER) -> str:
        """The job's history as JobHistory's JSON: the points from memory while the job
        reports, else read from the store (and not held: an ended job's points stay out of
        memory); up to `max_steps` step rows after `after_step`, saved or not yet saved."""
        points = self._points.get(job_id)
        if points is None:
            points = [json.loads(p) for p in self._store.points(job_id)]
        try:
            saved = self._store.steps(job_id, after_step, max_steps + 1)
        except sqlite3.Error:  # a failing disk: what is in memory still answers
            saved = []
        merged = {row[0]: row for row in saved}
        merged.update((step, row) for step, row in self._steps.get(job_id, {}).items()
                      if step > after_step)
        rows = [merged[step] for step in sorted(merged)]
        more = len(rows) > max_steps
        rows = rows[:max_steps]
        return json.dumps({
            "job_id": job_id, "points_kept": self.limit, "points": points,
            "steps": [dict(zip(("step", "loss", "lr", "grad_norm", "tokens"), row))
                      for row in rows],
            "next_after_step": rows[-1][0] if more else None})

    def forget(self, job_id: str) -> None:
        """Drop a job's points from memory (a deleted job's go from the store with its
        record)."""
        for kept in (self._points, self._stride, self._unsaved, self._dropped, self._retry,
                     self._steps):
            kept.pop(job_id, None)
