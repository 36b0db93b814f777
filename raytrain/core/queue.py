"""Admission: does a job's demand fit the capacity the cluster has left?

A job starts when its whole worker group fits what the cluster has minus what running jobs
hold (a group never starts half-way). The queue is oldest first, and a job that fits may start
past one that waits, a bounded number of times (`backfill`); a job whose group the cluster
could never hold is refused at submit (`never_fits`).

    demand = worker_group_demand(num_workers=2, cpus_per_worker=1.0, gpus_per_worker=0.0)
    admit(demand, total={"CPU": 2.0}, held=[])   # Admission(fits=True, reason=...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Admission:
    fits: bool
    reason: str


def worker_group_demand(
    num_workers: int, cpus_per_worker: float, gpus_per_worker: float
) -> dict[str, float]:
    demand = {"CPU": num_workers * cpus_per_worker}
    if gpus_per_worker > 0:
        demand["GPU"] = num_workers * gpus_per_worker
    return demand


def admit(
    demand: Mapping[str, float],
    total: Mapping[str, float],
    held: Sequence[Mapping[str, float]],
) -> Admission:
    """Decide whether `demand` fits `total` minus everything in `held`."""
    short = []
    for resource, amount in sorted(demand.items()):
        free = total.get(resource, 0.0) - sum(h.get(resource, 0.0) for h in held)
        if amount > free + 1e-9:
            short.append(
                f"{amount:g} {resource} (free {max(free, 0.0):g} of {total.get(resource, 0.0):g})"
            )
    if short:
        return Admission(False, "waiting for " + ", ".join(short))
    return Admission(True, "fits: " + ", ".join(f"{v:g} {k}" for k, v in sorted(demand.items())))


def never_fits(num_workers: int, per_worker: Mapping[str, float],
               nodes: Sequence[Mapping[str, float]]) -> str | None:
    """Why a worker group can never start on a fixed cluster of `nodes` (each node's total
    resources), even with nothing else running; None if it can. Each worker must fit on one
    node whole.

        never_fits(4, {"CPU": 1.0}, [{"CPU": 2.0}])   # "4 workers need ... the cluster holds 2"
    """
    wanted = {k: v for k, v in per_worker.items() if v > 0}
    room = 0
    for node in nodes:
        room += min((_holds(node.get(k, 0.0) / v, num_workers) for k, v in wanted.items()),
                    default=0)
    if room >= num_workers:
        return None
    total = {k: sum(node.get(k, 0.0) for node in nodes) for k in wanted}
    asks = ", ".join(f"{v:g} {k}" for k, v in sorted(wanted.items()))
    has = ", ".join(f"{v:g} {k}" for k, v in sorted(total.items()))
    return (f"{num_workers} workers of {asks} each can never start here: the cluster's "
            f"{len(nodes)} node(s) hold {has} in all, room for {room} such worker(s). To fix: "
            f"ask for at most {room} workers or less per worker, or run the service on a "
            "cluster that autoscales (raytrain serve --cluster-config)")


def _holds(share: float, most: int) -> int:
    """How many whole workers a node's `share` (its resource over one worker's ask) holds,
    counted no further than `most` (a tiny ask would hold more than a float can count)."""
    return most if share >= most else int(share + 1e-9)


@dataclass(frozen=True)
class Queued:
    """A job waiting for its worker group: what it asks for, and how many later jobs have
    started ahead of it while it waited."""

    job_id: str
    demand: Mapping[str, float]
    passed: int = 0


@dataclass(frozen=True)
class QueuePass:
    start: tuple[str, ...]  # jobs to start now, in queue order
    waiting: Mapping[str, str]  # every other job: why it waits
    passed: tuple[str, ...]  # waiting jobs a started job went ahead of


def backfill(queue: Sequence[Queued], total: Mapping[str, float],
             held: Sequence[Mapping[str, float]], max_passed: int) -> QueuePass:
    """One pass over the queue, oldest first. A job starts if its whole group fits what is
    free, even behind one that does not (backfill), until the first job that waits has been
    passed `max_passed` times: from then on nothing starts ahead of it, so the capacity that
    running jobs free goes to it and it cannot starve.

        backfill([Queued("big", {"CPU": 4}), Queued("small", {"CPU": 1})],
                 total={"CPU": 2}, held=[], max_passed=5).start   # ("small",)
    """
    held = list(held)
    start: list[str] = []
    waiting: dict[str, str] = {}
    blocker: Queued | None = None
    for position, job in enumerate(queue, start=1):
        where = f"queued, position {position} of {len(queue)}"
        if blocker is not None and blocker.passed >= max_passed:
            waiting[job.job_id] = (f"{where}: behind job {blocker.job_id}, which later jobs "
                                   f"have passed {blocker.passed} times already")
            continue
        decision = admit(job.demand, total, held)
        if decision.fits:
            start.append(job.job_id)
            held.append(job.demand)
            continue
        waiting[job.job_id] = f"{where}: {decision.reason}"
        blocker = blocker or job
    last_start = max((i for i, job in enumerate(queue) if job.job_id in start), default=-1)
    passed = tuple(job.job_id for job in queue[:last_start] if job.job_id in waiting)
    return QueuePass(tuple(start), waiting, passed)
