"""The sections of a job spec that say what a job runs on and what it may spend: resources
(workers, their CPUs, GPUs and accelerator) and capacity (the policy, market, deadline, budget
and hourly ceiling); each validates itself, and what must agree across sections is
raytrain.spec.job.JobSpec's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import InitErrorDetails

from raytrain.catalog.hardware import GPUS
from raytrain.spec._base import Strict, field_error, raise_if_any


def accelerator_errors(accelerator: str | None, loc: tuple[str, ...] = ("accelerator",)
                        ) -> list[InitErrorDetails]:
    if accelerator is None or accelerator in GPUS:
        return []
    return [field_error(
        loc,
        f"unknown accelerator {accelerator!r}. To fix: use one of " + ", ".join(sorted(GPUS)),
        accelerator,
    )]


RAY_GRANULARITY = 0.0001  # the smallest resource share Ray schedules


class ResourcesSpec(Strict):
    """What each training worker needs. GPUs imply NCCL; CPU-only workers use gloo."""

    num_workers: int = Field(2, ge=1, le=100_000, description="Training processes.")
    cpus_per_worker: float = Field(1.0, ge=RAY_GRANULARITY, le=1024, description=(
        "CPUs reserved per worker (at least 0.0001, Ray's smallest share)."))
    gpus_per_worker: float = Field(
        0.0, ge=0, le=16, description="GPUs per worker (0, or at least 0.0001, Ray's smallest "
        "share); 0 trains on CPU with gloo."
    )

    @field_validator("gpus_per_worker")
    @classmethod
    def _a_share_ray_holds(cls, value: float) -> float:
        if 0 < value < RAY_GRANULARITY:
            raise ValueError(f"{value} is below Ray's smallest share of a GPU. To fix: 0 for "
                             "CPU workers, or at least 0.0001")
        return value
    accelerator: str | None = Field(
        None,
        description="GPU kind, for the planner's predictions and for strategy 'auto': one of "
        + ", ".join(sorted(k for k in GPUS if k != "cpu")) + ". CPU workers are 'cpu'.",
    )

    @model_validator(mode="after")
    def _accelerator_known(self) -> ResourcesSpec:
        raise_if_any("ResourcesSpec", accelerator_errors(self.accelerator))
        return self

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0

    @property
    def device_kind(self) -> str | None:
        """The catalog kind the workers run on, when known."""
        return self.accelerator if self.use_gpu else "cpu"


Market = Literal["spot", "on-demand"]


class CapacitySpec(Strict):
    """How the service buys capacity for the job (on an autoscaling cluster); ignored on a
    fixed local cluster, where the job runs on what is there."""

    policy: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9-]*$",
        description="A named autoscaling policy from policies/ (cost-first, deadline-aware, "
        "on-demand-only, spot-only); default: the service's.",
    )
    market: Literal["auto", "spot", "on-demand"] = Field(
        "auto", description="Restrict to one market; 'auto' lets the policy choose."
    )
    deadline_hours: float | None = Field(
        None, gt=0, le=24 * 366,
        description="Finish within this many hours of submission, if possible."
    )
    budget_usd: float | None = Field(
        None, gt=0, le=1e9, description="Do not choose capacity expected to cost more than this."
    )
    max_usd_per_hour: float | None = Field(
        None, gt=0, le=1e7,
        description="Never hold capacity priced above this per hour, all nodes."
    )
