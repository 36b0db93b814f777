"""What a job's trackers are sent, as values: the metrics since a run's cursor, the run's
parameters and tags. Pure (no tracker, no clock): the pump (raytrain.serve.tracking.pump)
reads the job's history and status and hands these to each tracker.

Per step (the history's step rows, never thinned): `loss`, `lr`, `grad_norm`, `tokens`.
Per progress report, at its step: `tokens_per_s`, `mfu`, `cost_usd`, `usd_per_hour` (and a
mixture of experts' `balance_loss` and `expert_imbalance`); and the
validation loss at the step it was measured: `val_loss`, `val_perplexity`. A step already sent
is not sent again (a run that resumed from a checkpoint does a few steps again, with the same
losses to fp32 rounding: the tracker keeps the first).

    metrics, cursor = metrics_after(history, run)      # history: JobHistory's JSON, parsed
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from typing import Any

from raytrain.spec import JobState, JobStatus
from raytrain.spec.tracking import TrackedRun

STEP_KEYS = ("loss", "lr", "grad_norm", "tokens")
REPORT_KEYS = ("tokens_per_s", "mfu", "cost_usd", "usd_per_hour", "balance_loss",
               "expert_imbalance")


@dataclass(frozen=True)
class Metric:
    key: str
    value: float
    step: int
    time: float  # unix seconds


@dataclass(frozen=True)
class Cursor:
    sent_step: int
    sent_report: float
    sent_val_step: int


def metrics_after(history: dict[str, Any], run: TrackedRun) -> tuple[list[Metric], Cursor]:
    """The metrics of `history` the run has not taken, in step order, and the cursor after
    them."""
    out: list[Metric] = []
    points = [p for p in history.get("points", []) if p.get("time", 0.0) > run.sent_report]
    times = _report_times(history.get("points", []))
    sent_step = run.sent_step
    for row in history.get("steps", []):
        step = int(row["step"])
        if step <= run.sent_step:
            continue
        when = _time_of(step, times)
        out.extend(Metric(key, float(row[key]), step, when) for key in STEP_KEYS
                   if _number(row.get(key)))
        sent_step = max(sent_step, step)
    sent_report = run.sent_report
    for point in points:
        step, when = int(point["step"]), float(point["time"])
        out.extend(Metric(key, float(point[key]), step, when) for key in REPORT_KEYS
                   if _number(point.get(key)))
        if _number(point.get("val_loss")) and point.get("val_step") is not None:
            val = float(point["val_loss"])
            at = int(point["val_step"])
            out.append(Metric("val_loss", val, at, when))
            out.append(Metric("val_perplexity", math.exp(min(val, 700.0)), at, when))
        sent_report = max(sent_report, when)
    out = _first_of_each(out, run)
    val_step = max([run.sent_val_step] + [m.step for m in out if m.key == "val_loss"])
    return sorted(out, key=lambda m: (m.step, m.key)), Cursor(sent_step, sent_report, val_step)


def _first_of_each(metrics: list[Metric], run: TrackedRun) -> list[Metric]:
    """One value per (key, step): a validation loss is carried by every report after it
    was measured, and only its first report sends it."""
    seen: set[tuple[str, int]] = set()
    out = []
    for metric in metrics:
        if (metric.key, metric.step) in seen:
            continue
        if metric.key.startswith("val_") and metric.step <= run.sent_val_step:
            continue
        seen.add((metric.key, metric.step))
        out.append(metric)
    return out


Times = tuple[list[int], list[float], float]


def _report_times(points: list[dict[str, Any]]) -> Times:
    """Each report step's time (a step reported twice: its later report's), the steps
    ascending with the earliest time at or after each (a suffix minimum, so that a step's
    time is one bisection), and the latest time of all."""
    by_step = {int(p["step"]): float(p["time"]) for p in points}
    steps = sorted(by_step)
    earliest = [by_step[s] for s in steps]
    for i in range(len(earliest) - 2, -1, -1):
        earliest[i] = min(earliest[i], earliest[i + 1])
    return steps, earliest, max(by_step.values(), default=0.0)


def _time_of(step: int, times: Times) -> float:
    """A step's time: the first report at or after it (steps ride in the next report);
    after the last report, the latest report's."""
    steps, earliest, latest = times
    at = bisect.bisect_left(steps, step)
    return earliest[at] if at < len(steps) else latest


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def params_of(job: JobStatus) -> dict[str, str]:
    """The run's parameters: the spec (flattened, dotted keys) and the plan."""
    params = _flat(job.spec.model_dump(mode="json", exclude={"tracking"}), "")
    if job.plan is not None:
        plan = job.plan
        params["plan.layout"] = plan.layout.describe()
        params["plan.world_size"] = str(plan.layout.world_size)
        params["plan.predicted_step_s"] = json.dumps(plan.predicted_step_s)
        params["plan.tokens_per_step"] = str(plan.tokens_per_step)
    return params


def _flat(value: Any, prefix: str) -> dict[str, str]:
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}{key}."))
        return out
    text = value if isinstance(value, str) else json.dumps(value)
    return {prefix.rstrip("."): text[:6000]}


def tags_of(job: JobStatus) -> dict[str, str]:
    """What the run's tags say of the job now: its state, capacity and what it survived."""
    resources = job.resources
    capacity = f"{resources.nodes} x {resources.accelerator} ({resources.market}" + (
        f", {resources.offer})" if resources.offer else ")")
    return {"raytrain.job_id": job.id, "raytrain.state": job.state.value,
            "raytrain.capacity": capacity, "raytrain.preemptions": str(job.preemptions),
            "raytrain.restarts": str(job.restarts),
            "raytrain.cost_usd": f"{job.cost_usd:.4f}"}


def ended(state: JobState) -> str | None:
    """MLflow's word for how a run ended (None: it has not)."""
    return {JobState.SUCCEEDED: "FINISHED", JobState.FAILED: "FAILED",
            JobState.CANCELLED: "KILLED"}.get(state)
