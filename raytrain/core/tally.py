"""What the service counts for Prometheus, as values: jobs submitted and ended, preemptions,
restarts and dollars (counters that only grow, also across a restart of the job manager, which
keeps the tally in its store), and how long jobs wait, take to their first step and take to
checkpoint (histograms). Each job's own series (step, loss, cost) come from its status and
outlive it for a retention window, so a job's final figures can still be scraped.

It also counts the spot exposure the policy's preemption rates are estimated from: per offer,
the node-hours jobs held its spot capacity (from the dollars billed for it: every node from
when it was granted to when it went) and the preemptions they met there; and the time from
asking for an offer's nodes to their being up. Kept in the store with the rest, they survive
a restart of the service.

Everything here is a function of two statuses, the job before and after one lifecycle step;
serve.http.metrics turns a snapshot into prometheus_client's metric families.

    tally = Tally()
    tally.observe(before, after, now)          # after each lifecycle step of a job
    snapshot(tally, statuses, now, retention_s) # what /metrics shows
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Iterable

from raytrain.spec import JobState, JobStatus

# Upper bounds of each histogram's buckets, in seconds (+Inf is implied).
WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
CHECKPOINT_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
HISTOGRAMS: dict[str, tuple[str, tuple[float, ...]]] = {
    "queue_wait_seconds": ("From submit to capacity found (leaving PENDING the first time).",
                           WAIT_BUCKETS_S),
    "time_to_first_step_seconds": ("From submit to the first training step reported.",
                                   WAIT_BUCKETS_S),
    "checkpoint_seconds": ("Seconds each checkpoint took to save, as rank 0 measured.",
                           CHECKPOINT_BUCKETS_S),
}
COUNTERS: dict[str, str] = {
    "jobs_submitted": "Jobs accepted.",
    "preemptions": "Spot preemptions jobs survived.",
    "restarts": "Times training restarted from a checkpoint.",
    "spent_usd": "Dollars all jobs have spent.",
}
ENDED_HELP = "Jobs that ended, by final state."


@dataclass
class Histogram:
    counts: list[int]  # per bucket, the last one +Inf; not cumulative
    total: float = 0.0

    def observe(self, bounds: tuple[float, ...], value: float) -> None:
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.total += value


@dataclass
class Tally:
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))
    ended: dict[str, int] = field(default_factory=lambda: {
        s.value: 0 for s in JobState if s.is_terminal})
    histograms: dict[str, Histogram] = field(default_factory=lambda: {
        name: Histogram([0] * (len(bounds) + 1)) for name, (_, bounds) in HISTOGRAMS.items()})
    # Per offer id: (preemptions, node-hours) on its spot capacity; the policy's Observed.
    spot: dict[str, tuple[int, float]] = field(default_factory=dict)
    # Per offer id: (samples, total seconds) from asking for nodes to their being up; the
    # policy's measured ready_s (raytrain.core.costs). The provisioner adds to it.
    ready: dict[str, tuple[int, float]] = field(default_factory=dict)

    def observe(self, before: JobStatus | None, after: JobStatus, now: float) -> None:
        """Count what changed between a job's status before a lifecycle step (None: it was
        just submitted) and after it."""
        if before is None:
            self.counters["jobs_submitted"] += 1
            return
        if after.state.is_terminal and not before.state.is_terminal:
            self.ended[after.state.value] += 1
        preempted = max(0, after.preemptions - before.preemptions)
        spent = max(0.0, after.cost_usd - before.cost_usd)
        self.counters["preemptions"] += preempted
        self.counters["restarts"] += max(0, after.restarts - before.restarts)
        self.counters["spent_usd"] += spent
        held = before.resources
        if held.market == "spot" and held.offer and held.usd_per_hour > 0:
            count, hours = self.spot.get(held.offer, (0, 0.0))
            self.spot[held.offer] = (count + preempted,
                                     hours + spent / held.usd_per_hour * held.nodes)
        if before.state == JobState.PENDING and after.state == JobState.PROVISIONING \
                and after.started_at is None and after.restarts == 0:
            self._observe("queue_wait_seconds", now - after.created_at)
        if before.progress.step == 0 and after.progress.step > 0 and after.restarts == 0 \
                and not after.preemptions:
            self._observe("time_to_first_step_seconds", now - after.created_at)
        saved = after.checkpoint
        if saved is not None and saved.save_s is not None and saved != before.checkpoint:
            self._observe("checkpoint_seconds", saved.save_s)

    def _observe(self, name: str, value: float) -> None:
        self.histograms[name].observe(HISTOGRAMS[name][1], max(0.0, value))

    def to_json(self) -> dict[str, Any]:
        return {"counters": self.counters, "ended": self.ended,
                "histograms": {k: {"counts": h.counts, "total": h.total}
                               for k, h in self.histograms.items()},
                "spot": {offer: list(seen) for offer, seen in self.spot.items()},
                "ready": {offer: list(seen) for offer, seen in self.ready.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Tally:
        """A tally read back from the store; names it does not know start at zero (a tally
        written by an older version lacks them), and bucket counts of changed bounds are
        dropped rather than misplaced."""
        tally = cls()
        if not data:
            return tally
        for name, value in data.get("counters", {}).items():
            if name in tally.counters:
                tally.counters[name] = float(value)
        for state, value in data.get("ended", {}).items():
            if state in tally.ended:
                tally.ended[state] = int(value)
        for name, saved in data.get("histograms", {}).items():
            mine = tally.histograms.get(name)
            if mine is not None and len(saved["counts"]) == len(mine.counts):
                tally.histograms[name] = Histogram(list(saved["counts"]), float(saved["total"]))
        for offer, (count, hours) in data.get("spot", {}).items():
            tally.spot[offer] = (int(count), float(hours))
        for offer, (count, seconds) in data.get("ready", {}).items():
            tally.ready[offer] = (int(count), float(seconds))
        return tally


# Each job's own series: (name, help, how to read it from the status).
JOB_GAUGES: dict[str, tuple[str, Any]] = {
    "job_step": ("Optimizer steps completed.", lambda j: j.progress.step),
    "job_loss": ("Latest training loss.", lambda j: j.progress.loss),
    "job_tokens_per_second": ("Recent throughput (0 once ended).",
                              lambda j: 0.0 if j.state.is_terminal else j.progress.tokens_per_s),
    "job_val_loss": ("Latest validation loss (data.validation).",
                     lambda j: j.progress.val_loss),
    "job_val_perplexity": ("Latest validation perplexity, exp(val_loss).",
                           lambda j: j.progress.val_perplexity),
    "job_mfu": ("Model FLOPs utilisation of the recent throughput (0 once ended).",
                lambda j: 0.0 if j.state.is_terminal else j.progress.mfu),
    "job_cost_usd": ("Dollars spent so far.", lambda j: j.cost_usd),
    "job_usd_per_hour": ("Hourly price of the capacity the job holds (0 once ended).",
                         lambda j: 0.0 if j.state.is_terminal else j.resources.usd_per_hour),
    "job_restarts": ("Restarts from a checkpoint.", lambda j: j.restarts),
    "job_preemptions": ("Spot preemptions survived.", lambda j: j.preemptions),
}


def shown(job: JobStatus, now: float, retention_s: float) -> bool:
    """Whether a job's own series are still exported: while it is active, and for
    retention_s after it ended."""
    return not job.state.is_terminal or now - (job.finished_at or now) <= retention_s


def snapshot(tally: Tally, jobs: Iterable[JobStatus], now: float,
             retention_s: float) -> dict[str, Any]:
    """Everything /metrics shows, as plain values (it crosses the actor boundary)."""
    jobs = list(jobs)
    series = []
    for job in jobs:
        if not shown(job, now, retention_s):
            continue
        labels = {"job": job.id, "name": job.spec.name, "state": job.state.value}
        values = {name: read(job) for name, (_, read) in JOB_GAUGES.items()}
        series.append({"labels": labels,
                       "values": {k: v for k, v in values.items() if v is not None}})
    return {
        **tally.to_json(),
        "jobs_by_state": {s.value: sum(1 for j in jobs if j.state == s) for s in JobState},
        "usd_per_hour": sum(j.resources.usd_per_hour for j in jobs if not j.state.is_terminal),
        "job_series": series,
    }
