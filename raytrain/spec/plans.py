"""POST /v1/plans: ranked layouts of a job on some hardware (raytrain.core.resolve ranks
them). A row's degrees, micro-batch and recomputation are raytrain.spec.layout.Layout's
fields, flattened."""

from __future__ import annotations

from pydantic import Field, model_validator

from raytrain.spec._base import Record, Strict, field_error, raise_if_any
from raytrain.spec.job import JobSpec
from raytrain.spec.layout import FIELD_DOCS
from raytrain.spec.sections import accelerator_errors


class PlanRequest(Strict):
    """POST /v1/plans: rank the layouts of a job on some hardware."""

    spec: JobSpec = Field(description="The job (its model, batch and precision matter).")
    gpus: int | None = Field(None, ge=1, le=100_000,
                             description="Devices; default resources.num_workers.")
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
    """One feasible layout, with what the planner predicts for it."""

    rank: int = Field(description="Place in the ranking, from 1 (best).")
    layout: str = Field(description="Degrees, schedule, micro-batch x count, recomputation.")
    dp_replicate: int = Field(description=FIELD_DOCS["dp_replicate"])
    dp_shard: int = Field(description=FIELD_DOCS["dp_shard"])
    tp: int = Field(description=FIELD_DOCS["tp"])
    pp: int = Field(description=FIELD_DOCS["pp"])
    virtual_stages: int = Field(description=FIELD_DOCS["virtual_stages"])
    micro_batch_size: int = Field(description=FIELD_DOCS["micro_batch_size"])
    microbatches: int = Field(description=FIELD_DOCS["microbatches"])
    recompute: str = Field(description=FIELD_DOCS["recompute"])
    step_s: float = Field(description="Predicted seconds per optimizer step.")
    tokens_per_s: float = Field(description="Predicted training tokens per second, all devices.")
    mfu: float = Field(description="Predicted model FLOPs utilisation (0-1) of peak.")
    memory_gib: float = Field(description="Predicted memory per device.")
    memory_limit_gib: float = Field(description="Usable memory per device.")
    scaling_efficiency: float = Field(description="Throughput over N x one device's.")
    usd_per_million_tokens: float | None = Field(
        description="Dollars per million training tokens at the request's price (null: no "
        "price given).")
    reason: str = Field(description="The planner's one-line account of this layout.")


class PlanResponse(Record):
    """POST /v1/plans' answer: the layouts that fit, best first."""

    accelerator: str = Field(description="The device kind planned for.")
    gpus: int = Field(description="The number of devices planned for.")
    catalog_version: str = Field(description="The hardware catalog the plans were made with.")
    plans: list[PlanRow] = Field(description="Feasible layouts, fastest first.")
