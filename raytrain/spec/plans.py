"""POST /v1/plans: ranked layouts of a job on some hardware (raytrain.core.resolve ranks
them). A row's degrees, micro-batch and recomputation are raytrain.spec.layout.Layout's
fields, flattened."""

from __future__ import annotations

from pydantic import Field, model_validator

from raytrain.spec._base import Record, Strict, field_error, raise_if_any
from raytrain.spec.job import JobSpec
from raytrain.spec.sections import accelerator_errors


class PlanRequest(Strict):
    """POST /v1/plans: rank the layouts of a job on some hardware."""

    spec: JobSpec = Field(description="The job (its model, batch and precision matter).")
    gpus: int | None = Field(None, ge=1, description="Devices; default resources.num_workers.")
    accelerator: str | None = Field(
        None, description="Device kind; default resources.accelerator, or 'cpu'."
    )
    usd_per_gpu_hour: float | None = Field(
        None, ge=0, description="Hourly price per device, for dollars per million tokens."
    )
    keep: int = Field(10, ge=1, le=200, description="How many plans to return.")

    @model_validator(mode="after")
    def _kind_known(self) -> PlanRequest:
        raise_if_any("PlanRequest", accelerator_errors(self.accelerator))
        if self.spec.model.kind != "gpt":
            raise_if_any("PlanRequest", [field_error(
                ("spec", "model", "kind"),
                "the planner needs the model's dimensions: it plans the built-in GPT. To "
                "fix: describe your model as model.gpt, or pick a strategy yourself",
                self.spec.model.kind,
            )])
        return self


class PlanRow(Record):
    rank: int
    layout: str = Field(description="Degrees, schedule, micro-batch x count, recomputation.")
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    virtual_stages: int
    micro_batch_size: int
    microbatches: int
    recompute: str
    step_s: float
    tokens_per_s: float
    mfu: float
    memory_gib: float = Field(description="Predicted memory per device.")
    memory_limit_gib: float = Field(description="Usable memory per device.")
    scaling_efficiency: float = Field(description="Throughput over N x one device's.")
    usd_per_million_tokens: float | None
    reason: str


class PlanResponse(Record):
    accelerator: str
    gpus: int
    catalog_version: str
    plans: list[PlanRow]
