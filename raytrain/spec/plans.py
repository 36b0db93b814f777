"""POST /v1/plans: ranked layouts of a job on some hardware (raytrain.core.resolve ranks
them), or one layout evaluated as given (`layout`), on a named node shape (`shape`) or one
described (`node_shape`: a cluster of one's own). A row's degrees, micro-batch and
recomputation are raytrain.spec.layout.Layout's fields, flattened."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from raytrain.catalog.hardware import LINKS, NODE_SHAPES
from raytrain.spec._base import Record, Strict, field_error, raise_if_any
from raytrain.spec.job import JobSpec
from raytrain.spec.layout import FIELD_DOCS
from raytrain.spec.resources import accelerator_errors

MAX_DEVICES = 100_000  # the most devices one plan is made for


class LayoutChoice(Strict):
    """One layout to evaluate as it is, rather than the ranking (`raytrain plan --layout`)."""

    dp_replicate: int = Field(1, ge=1, le=MAX_DEVICES, description=FIELD_DOCS["dp_replicate"])
    dp_shard: int = Field(1, ge=1, le=MAX_DEVICES, description=FIELD_DOCS["dp_shard"])
    tp: int = Field(1, ge=1, le=1024, description=FIELD_DOCS["tp"])
    pp: int = Field(1, ge=1, le=1024, description=FIELD_DOCS["pp"])
    virtual_stages: int = Field(1, ge=1, le=64, description=FIELD_DOCS["virtual_stages"])
    micro_batch_size: int | None = Field(
        None, ge=1, le=1_000_000,
        description="Sequences per micro-batch on each rank; default training.micro_batch_size.")
    recompute: Literal["none", "selective", "full"] | None = Field(
        None, description="Activation recomputation; default the spec's parallel.recompute.")
    reduce_scatter_once: bool | None = Field(
        None, description=FIELD_DOCS["reduce_scatter_once"] + " Default the spec's "
        "parallel.reduce_scatter_once.")
    zero2: bool | None = Field(
        None, description=FIELD_DOCS["zero2"] + " Default the spec's parallel.zero2.")

    @property
    def devices(self) -> int:
        """The device count the layout spans: the product of its degrees."""
        return self.dp_replicate * self.dp_shard * self.tp * self.pp


class ShapeSpec(Strict):
    """A node of a cluster of one's own (`raytrain plan --shape-file`): its GPUs, the link
    between them and its network."""

    name: str = Field("custom", max_length=100, description="A name for the plans' heading.")
    gpu: str = Field(description="The GPUs' kind, e.g. a100-80gb-sxm, h100-sxm, rtx4090.")
    gpus_per_node: int = Field(ge=1, le=64, description="GPUs in one node.")
    intra_link: str | None = Field(
        None, description="The link between a node's GPUs, by name: " + ", ".join(LINKS)
        + ". Or give intra_gbytes_per_s.")
    intra_gbytes_per_s: float | None = Field(
        None, gt=0, le=10_000, description="Bandwidth between a node's GPUs, GB/s per GPU "
        "per direction (NVLink 4: 450; PCIe 4 with peer-to-peer: 25; without: 10).")
    inter_gbits_per_gpu: float = Field(
        gt=0, le=100_000, description="Network between nodes, Gbit/s per GPU (DGX H100, one "
        "NDR port per GPU: 400; 8 GPUs behind one 25 GbE port: 3.125).")
    rdma: bool = Field(True, description="InfiniBand or EFA (RDMA); false: TCP over Ethernet.")

    @model_validator(mode="after")
    def _one_intra_link(self) -> ShapeSpec:
        errors = accelerator_errors(self.gpu, ("gpu",))
        if (self.intra_link is None) == (self.intra_gbytes_per_s is None):
            errors.append(field_error(("intra_link",), "give the link between a node's GPUs "
                                      "once. To fix: set intra_link (a name) or "
                                      "intra_gbytes_per_s (a bandwidth), not both or neither",
                                      self.intra_link))
        elif self.intra_link is not None and self.intra_link not in LINKS:
            errors.append(field_error(("intra_link",), f"unknown link {self.intra_link!r}. To "
                                      "fix: use one of " + ", ".join(LINKS) + ", or give "
                                      "intra_gbytes_per_s", self.intra_link))
        raise_if_any("ShapeSpec", errors)
        return self


class PlanRequest(Strict):
    """POST /v1/plans: rank the layouts of a job on some hardware."""

    spec: JobSpec = Field(description="The job (its model, batch and precision matter).")
    gpus: int | None = Field(None, ge=1, le=MAX_DEVICES,
                             description="Devices; default resources.num_workers.")
    accelerator: str | None = Field(
        None, description="Device kind; default resources.accelerator, or 'cpu'."
    )
    usd_per_gpu_hour: float | None = Field(
        None, ge=0, description="Hourly price per device, for dollars per million tokens."
    )
    keep: int = Field(10, ge=1, le=200, description="How many plans to return.")
    layout: LayoutChoice | None = Field(
        None, description="Evaluate this layout only (its degrees' product is the device "
        "count) rather than ranking them all.")
    shape: str | None = Field(
        None, description="A node shape by name: " + ", ".join(NODE_SHAPES) + ", or an "
        "offer's id or instance type from the shipped offers (e.g. p5.48xlarge, "
        "runpod/secure/8x-rtx4090). Default: the device kind's usual node.")
    node_shape: ShapeSpec | None = Field(
        None, description="A node shape of one's own, instead of `shape`.")
    precision: Literal["fp32", "bf16", "fp8"] | None = Field(
        None, description="Compute precision planned for (fp8: bf16 with float8 linears, on "
        "GPUs with FP8 tensor cores). Default: the spec's "
        "training.precision when it states one, else bf16 on GPUs that have it and fp32 on "
        "others and on CPU.")

    @model_validator(mode="after")
    def _kind_known(self) -> PlanRequest:
        raise_if_any("PlanRequest", accelerator_errors(self.accelerator))
        if self.shape is not None and self.node_shape is not None:
            raise_if_any("PlanRequest", [field_error(
                ("shape",), "name a shape or describe one, not both. To fix: drop shape or "
                "node_shape", self.shape)])
        if self.layout is not None:
            devices = self.layout.devices
            if devices > MAX_DEVICES:
                raise_if_any("PlanRequest", [field_error(
                    ("layout",), f"the degrees' product is {devices:,} devices, more than "
                    f"the planner takes ({MAX_DEVICES:,}). To fix: use smaller degrees",
                    devices)])
        if self.spec.model.planned_shape is None:
            raise_if_any("PlanRequest", [field_error(
                ("spec", "model", "shape"),
                "the planner needs the model's dimensions. To fix: state them as model.shape "
                "(or plan with `raytrain plan --model-config config.json`), or pick a "
                "strategy yourself", None,
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
    tflops_per_gpu: float = Field(
        description="Predicted model TFLOP/s per device (the model's FLOPs, not counting "
        "recomputation).")
    mfu: float = Field(description="Predicted model FLOPs utilisation (0-1) of peak.")
    memory_gib: float = Field(description="Predicted memory per device.")
    memory_limit_gib: float = Field(description="Usable memory per device.")
    fits: bool = Field(description="Whether the predicted memory fits the usable memory (a "
                       "ranking holds only plans that fit; a layout asked for may not).")
    tight: bool = Field(False, description="Over the usable memory but within the device's: "
                        "it may run, without the room the allocator's fragmentation needs. "
                        "Never ranked; a layout asked for is kept, with a warning.")
    breakdown: dict[str, float] = Field(
        description="Seconds per step by part: compute, each kind of communication not "
        "hidden behind compute, the pipeline bubble, the optimizer; 'total' is step_s.")
    scaling_efficiency: float = Field(description="Throughput over N x one device's.")
    usd_per_million_tokens: float | None = Field(
        description="Dollars per million training tokens at the request's price (null: no "
        "price given).")
    reason: str = Field(description="The planner's one-line account of this layout.")


class PlanResponse(Record):
    """POST /v1/plans' answer: the layouts that fit, best first."""

    accelerator: str = Field(description="The device kind planned for.")
    gpus: int = Field(description="The number of devices planned for.")
    shape: str = Field(description="The node shape planned on (GPUs per node and links).")
    precision: str = Field(description="The compute precision planned for: fp32, bf16 or "
                           "fp8.")
    catalog_version: str = Field(description="The hardware catalog the plans were made with.")
    params: int = Field(0, description="The model's parameters (memory counts them all).")
    active_params: int = Field(0, description="The parameters a token's compute goes through "
                               "(a mixture of experts' top-k experts, not all; the FLOPs "
                               "are counted from these). Equal to params for a dense model.")
    plans: list[PlanRow] = Field(description="Feasible layouts, fastest first.")
