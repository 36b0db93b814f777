"""POST /v1/plans: ranked layouts of a job on some hardware."""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field, model_validator

from raytrain.core.hardware import CATALOG_VERSION
from raytrain.core.planner import plan
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


def rank_plans(request: PlanRequest) -> PlanResponse:
    """The ranked plans for a request; raises NothingFits with the smallest changes."""
    spec = request.spec
    dims, work, kind, gpus = spec.planner_inputs(request.gpus, request.accelerator)
    # Ranking searches micro-batch sizes and recomputation too, not only the spec's own.
    work = replace(work, micro_batch_options=(1, 2, 4, 8, 16), recompute_options=("none", "full"))
    plans = plan(dims, work, kind, gpus, request.usd_per_gpu_hour, keep=request.keep)
    rows = []
    for index, p in enumerate(plans, start=1):
        c = p.candidate
        rows.append(PlanRow(
            rank=index, layout=c.describe(), dp_replicate=c.dp_replicate, dp_shard=c.dp_shard,
            tp=c.tp, pp=c.pp, virtual_stages=c.virtual_stages, micro_batch_size=c.micro_batch,
            microbatches=c.microbatches, recompute=c.recompute, step_s=p.step_s,
            tokens_per_s=p.tokens_per_s, mfu=p.mfu, memory_gib=p.memory_bytes / 2**30,
            memory_limit_gib=p.memory_limit_bytes / 2**30,
            scaling_efficiency=p.scaling_efficiency,
            usd_per_million_tokens=p.usd_per_million_tokens, reason=p.reason,
        ))
    return PlanResponse(accelerator=kind, gpus=gpus, catalog_version=CATALOG_VERSION, plans=rows)
