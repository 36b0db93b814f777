"""What happens to a job, as the lifecycle's input (raytrain.core.lifecycle.step): a request,
a scheduling decision, a report from rank 0, or what the cluster did. Plain frozen values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

from raytrain.core.lifecycle.values import Run
from raytrain.spec import DecisionRecord, JobCosts, PlanSummary, Resources
from raytrain.spec.tracking import TrackingState


@dataclass(frozen=True)
class Submitted:
    pass


@dataclass(frozen=True)
class Queued:
    message: str  # why it waits (its place in the queue)


@dataclass(frozen=True)
class Passed:
    """A job behind this one started first (see core.capacity.backfill)."""


@dataclass(frozen=True)
class CapacityDecided:
    """The policy decided where the job runs (resources), or that nothing fits (None);
    `costs`, the figures it priced with; `reference_usd`, on-demand from the start (the
    regret cap's reference), with the first decision."""

    decision: DecisionRecord
    resources: Resources | None
    message: str
    costs: JobCosts | None = None
    reference_usd: float | None = None


@dataclass(frozen=True)
class NodesHeld:
    """The nodes the job holds now, as the cluster shows them (the scheduler attributes each
    bought node to the job whose request it answers): billed from when each appears to when
    it goes or the job lets it go."""

    nodes: frozenset[str]
    usd_per_hour: float  # per node


@dataclass(frozen=True)
class Launched:
    run: Run
    plan: PlanSummary | None = None  # the layout this run trains with; None: the job's own


@dataclass(frozen=True)
class GroupStarted:
    resumed_step: int
    placement_group: str | None = None
    accelerator: str = "cpu"
    nodes: int = 1


@dataclass(frozen=True)
class ProgressReported:
    attempt: int
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class CheckpointCommitted:
    attempt: int
    step: int
    path: str
    save_s: float | None = None  # training's stall for it, as rank 0 measured it
    durable_s: float | None = None  # from the save's start to its commit (None: = save_s)


@dataclass(frozen=True)
class GroupChanged:
    """A replica group of an elastic run changed, as its workers report it: `leaving` (a
    notice for its nodes: it leaves at a step boundary), `gone` (it left, or died with its
    node: the others train on), `healing` (a replacement is taking the state from a live
    group) or `training` (it trains, from `step`). `redone_steps`: steps the survivors did
    again after a loss without notice; `stall_s`: how long the survivors stalled for it."""

    attempt: int
    group: int
    state: str
    nodes: frozenset[str] = frozenset()
    step: int = 0
    notice: bool = False
    redone_steps: int = 0
    stall_s: float | None = None


@dataclass(frozen=True)
class FinalReport:
    attempt: int
    result: Mapping[str, Any]


@dataclass(frozen=True)
class RunEnded:
    """The runner returned: `error` is the failure it raised (None: it returned), `alive`
    the cluster's nodes now (a node the run started on that is gone was lost)."""

    error: str | None
    alive: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StopOverdue:
    """A worker group asked to stop is still there after its grace."""


@dataclass(frozen=True)
class CancelRequested:
    pass


@dataclass(frozen=True)
class Reviewed:
    """The policy looked at the running job again: `decision` (and `moving_to`) when it moves
    it; `decision` alone when it stays with a new checkpoint interval."""

    decision: DecisionRecord | None = None
    resources: Resources | None = None
    moving_to: str | None = None


@dataclass(frozen=True)
class ServiceRestarted:
    pass


@dataclass(frozen=True)
class ServiceStopping:
    pass


@dataclass(frozen=True)
class TrackingNoted:
    """What the trackers took of the job's run (raytrain.serve.tracking): kept with the
    record; saved at once when a run is made, a warning comes or goes, or the job has ended
    (no progress save comes after), else with the job's next save."""
    tracking: TrackingState


Event = Union[Submitted, Queued, Passed, CapacityDecided, NodesHeld, Launched, GroupStarted,
              ProgressReported, CheckpointCommitted, GroupChanged, FinalReport, RunEnded,
              StopOverdue, CancelRequested, Reviewed, ServiceRestarted, ServiceStopping,
              TrackingNoted]
