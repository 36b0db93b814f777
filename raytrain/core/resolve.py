"""A job's layout and plan, decided once: at submit on a fixed cluster, and again only when
the policy buys different capacity for it. The result (a PlanSummary holding the Layout) is
stored with the job; the runner, the workers, a store reload and /metrics read it and never
plan again, so a later change to the hardware catalog cannot invalidate a stored job.

Validation (raytrain.spec) checks the document and a stated layout; what needs the planner
is here: `strategy: auto`, the planner's predicted figures for a layout, and the rankings of
POST /v1/plans.

    summary = plan_summary(spec)            # raises SpecError when strategy 'auto' finds nothing
    train(spec, worker, sink, root, layout=summary.layout)
"""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Sequence

from raytrain.catalog.hardware import (
    CATALOG,
    CATALOG_VERSION,
    LINKS,
    Catalog,
    Link,
    NodeShape,
    fp8_kinds,
    network_link,
)
from raytrain.core.cost_model import mfu
from raytrain.core.planner import ModelDims, NothingFits, Plan, Workload, evaluate, plan
from raytrain.core.shapes import node_shape_of
from raytrain.errors import FieldError, SpecError
from raytrain.spec import (
    JobSpec,
    LayoutChoice,
    Offer,
    PlanRequest,
    PlanResponse,
    PlanRow,
    PlanSummary,
)
from raytrain.spec.layout import Layout, check_layout, divisors


def planner_inputs(spec: JobSpec, gpus: int | None = None, accelerator: str | None = None
                   ) -> tuple[ModelDims, Workload, str, int]:
    """What the planner needs to know of a job: the built-in GPT's dimensions, or an
    imported model's stated shape (model.shape), which trains data parallel only."""
    gpt = spec.model.planned_shape
    if gpt is None:
        raise SpecError([FieldError(("model", "shape"), (
            "the planner needs the model's dimensions. To fix: state them as model.shape, "
            "or pick a strategy yourself"))])
    dims = ModelDims.from_gpt(gpt.num_layers, gpt.dim, gpt.num_heads, gpt.hidden_dim,
                              gpt.vocab_size, spec.data.seq_len, gpt.max_seq_len,
                              gpt.num_kv_heads, gpt.mlp == "swiglu", gpt.positions == "rotary",
                              gpt.tie_embeddings, gpt.head_dim, gpt.qk_norm, gpt.moe,
                              gpt.mla)
    work = Workload(
        global_batch=spec.training.global_batch_size,
        precision=planned_precision(spec.training.precision),
        recompute_options=(spec.parallel.recompute_mode,),
        micro_batch_options=(spec.training.micro_batch_size,),
        data_parallel_only=not spec.model.builtin or spec.training.lora is not None
        or gpt.moe is not None,  # a mixture of experts: data parallel or FSDP (spec.job)
        trainable_share=lora_share(spec, dims),
        frozen_param_bytes=2 if spec.training.lora is not None
        and spec.training.precision == "bf16" else 4,
        grad_reduce_bytes=2 if spec.parallel.grad_reduce_dtype == "bf16" else 4,
        chunked_loss=spec.model.builtin,
    )
    kind = accelerator or spec.resources.device_kind or "cpu"
    return dims, work, kind, gpus or spec.resources.num_workers


def lora_share(spec: JobSpec, dims: ModelDims) -> float:
    """The share of the model's parameters a training.lora job trains (its adapters: rank x
    (in + out) for each targeted linear of each block); 1 without LoRA."""
    lora = spec.training.lora
    if lora is None:
        return 1.0
    d, q, kv, f = dims.dim, dims.q_dim, dims.kv_dim, dims.ffn_dim
    sides = {"q_proj": d + q, "k_proj": d + kv, "v_proj": d + kv, "o_proj": q + d,
             "gate_proj": d + f, "up_proj": d + f, "down_proj": f + d}
    adapters = dims.num_layers * lora.rank * sum(sides[t] for t in lora.targets)
    return adapters / (dims.params + adapters)


def job_layout(spec: JobSpec) -> Layout:
    """The layout the job trains with: the one it states, or for strategy 'auto' the
    planner's fastest that fits its model, workers and device kind (SpecError if none)."""
    stated = spec.stated_layout()
    if stated is not None:
        return stated
    here = ("parallel", "strategy")
    dims, work, kind, count = planner_inputs(spec)
    try:
        best = plan(dims, work, kind, count, keep=1)[0].candidate
    except NothingFits as exc:  # its message carries its suggestions ("To fix: ...")
        raise SpecError([FieldError(here, str(exc))]) from None
    layout = replace(best, sequence_parallel=spec.parallel.sequence_parallel)
    problems = spec.layout_problems(layout)
    if problems:
        raise SpecError([FieldError(p.field, f"with the planner's layout "
                                    f"({layout.describe()}): {p.message}") for p in problems])
    return layout


def predicted(spec: JobSpec, layout: Layout, hardware: Catalog = CATALOG) -> Plan | None:
    """The planner's figures for `layout` on `hardware`, when the model's dimensions (the
    built-in GPT's, or an imported model's model.shape) and the device kind are known."""
    if spec.model.planned_shape is None or spec.resources.device_kind is None:
        return None
    dims, work, kind, _ = planner_inputs(spec)
    shape = hardware.cpu_share(hardware.node_shape(kind), spec.resources.cpus_per_worker)
    return evaluate(dims, work, layout, shape)


def measured_mfu(spec: JobSpec, tokens_per_s: float, devices: int, accelerator: str,
                 hardware: Catalog = CATALOG) -> float | None:
    """Model FLOPs utilisation of a measured throughput: tokens/s times the model's FLOPs
    per token (as the planner counts them, recomputation not included), over `devices`
    devices of `accelerator` at their peak for the job's precision. None when the model's
    shape or the device kind is not known."""
    if spec.model.planned_shape is None or devices < 1:
        return None
    try:
        gpu = hardware.node_shape(accelerator).gpu
    except KeyError:
        return None
    dims, work, _, _ = planner_inputs(spec)
    return mfu(tokens_per_s, dims, devices, gpu, work.precision)


def plan_summary(spec: JobSpec, layout: Layout | None = None, hardware: Catalog = CATALOG
                 ) -> PlanSummary:
    """What is stored with the job: its layout, and the planner's figures for it on
    `hardware`."""
    layout = layout or job_layout(spec)
    figures = predicted(spec, layout, hardware)
    return PlanSummary(
        strategy=spec.parallel.strategy,
        layout=layout,
        description=layout.describe(),
        predicted_step_s=figures.step_s if figures else None,
        predicted_tokens_per_s=figures.tokens_per_s if figures else None,
        predicted_memory_gib=figures.memory_bytes / 2**30 if figures else None,
        reason=figures.reason if figures else None,
        grad_accum_steps=layout.microbatches,
        tokens_per_step=spec.tokens_per_step,
        backend="nccl" if spec.resources.use_gpu else "gloo",
        catalog_version=CATALOG_VERSION,
    )


def rank_plans(request: PlanRequest, offers: Sequence[Offer] = (),
               hardware: Catalog = CATALOG) -> PlanResponse:
    """POST /v1/plans: the ranked plans for a request, or the one layout it asks for on the
    node shape it names (a catalog shape, or one of `offers` by id or instance type); raises
    NothingFits with the smallest changes that would fit, and SpecError naming the field
    when the shape or the layout cannot work. Devices are as `hardware` has them."""
    spec = request.spec
    shape = request_shape(request, offers, hardware)
    kind = shape.gpu.name
    choice = request.layout
    gpus = request.gpus or (choice.devices if choice is not None else None)
    dims, work, _, gpus = planner_inputs(spec, gpus, kind)
    work = replace(work, precision=request.precision or default_precision(spec, kind))
    if work.precision == "fp8" and not shape.gpu.fp8_flops and kind != "cpu":
        raise SpecError([FieldError(("precision",), (
            f"{kind} has no FP8 tensor cores. To fix: plan for bf16, or for one of "
            f"{', '.join(fp8_kinds(hardware.gpus))}"))])
    if choice is not None:
        chosen = chosen_layout(choice, spec, dims, work, gpus)
        if work.precision == "fp8" and chosen.tp_enabled:
            raise SpecError([FieldError(("layout", "tp"), (
                "fp8 does not combine with tensor parallelism yet. To fix: set tp to 1, or "
                "plan for bf16"))])
        plans = [evaluate(dims, work, chosen, shape, request.usd_per_gpu_hour)]
    else:
        # Ranking searches micro-batch sizes and recomputation too, not only the spec's own.
        work = replace(work, micro_batch_options=(1, 2, 4, 8, 16),
                       recompute_options=("none", "full"))
        plans = plan(dims, work, kind, gpus, request.usd_per_gpu_hour, shape=shape,
                     keep=request.keep)
    rows = [
        PlanRow(
            rank=index, layout=p.candidate.describe(),
            **{k: v for k, v in asdict(p.candidate).items() if k in PlanRow.model_fields},
            step_s=p.step_s, tokens_per_s=p.tokens_per_s,
            tflops_per_gpu=p.tokens_per_s * dims.flops_per_token / gpus / 1e12, mfu=p.mfu,
            memory_gib=p.memory_bytes / 2**30, memory_limit_gib=p.memory_limit_bytes / 2**30,
            fits=p.fits, tight=p.tight, breakdown=p.breakdown,
            scaling_efficiency=p.scaling_efficiency,
            usd_per_million_tokens=p.usd_per_million_tokens, reason=p.reason,
        )
        for index, p in enumerate(plans, start=1)
    ]
    return PlanResponse(accelerator=kind, gpus=gpus, shape=shape.name, precision=work.precision,
                        catalog_version=CATALOG_VERSION, params=dims.params,
                        active_params=dims.active_params, plans=rows)


# GPUs whose half precision is fp16 only (no bf16): planned in fp32 unless told otherwise.
NO_BF16 = frozenset({"cpu", "v100-16gb", "t4"})


def default_precision(spec: JobSpec, kind: str) -> str:
    """What a plan assumes: the spec's precision when it states one, else bf16 where the
    device has it (what a GPU job should train in) and fp32 elsewhere."""
    if "precision" in spec.training.model_fields_set:
        return planned_precision(spec.training.precision)
    return "fp32" if kind in NO_BF16 else "bf16"


def planned_precision(precision: str) -> str:
    """The planner's precision for a spec's: fp16 is timed as bf16 (the same tensor cores)."""
    return precision if precision in ("fp32", "fp8") else "bf16"


def request_shape(request: PlanRequest, offers: Sequence[Offer] = (),
                  hardware: Catalog = CATALOG) -> NodeShape:
    """The node shape a plan request names (in the catalog or among `offers`), describes,
    or implies by its device kind."""
    custom, name = request.node_shape, request.shape
    if custom is not None:
        # The spec holds exactly one of the two (NodeShapeSpec's check).
        intra = LINKS[custom.intra_link] if custom.intra_link else Link(
            "custom", (custom.intra_gbytes_per_s or 0.0) * 1e9, 15e-6)
        shape = NodeShape(custom.name, hardware.gpus[custom.gpu], custom.gpus_per_node, intra,
                          network_link(custom.inter_gbits_per_gpu * custom.gpus_per_node,
                                       custom.gpus_per_node, custom.rdma))
    elif name is not None:
        shape = hardware.shapes.get(name) or _offer_shape(name, offers, hardware)
    else:
        return hardware.node_shape(request.accelerator or request.spec.resources.device_kind
                                   or "cpu")
    if request.accelerator not in (None, shape.gpu.name):
        raise SpecError([FieldError(("accelerator",), (
            f"the shape {shape.name} has {shape.gpu.name} GPUs, not {request.accelerator}. "
            "To fix: drop the accelerator, or name a shape of those GPUs"))], "plan request")
    return shape


def _offer_shape(name: str, offers: Sequence[Offer], hardware: Catalog) -> NodeShape:
    found = next((o for o in offers if name in (o.id, o.instance_type)), None)
    if found is None:
        known = sorted({*hardware.shapes, *(o.instance_type for o in offers)})
        raise SpecError([FieldError(("shape",), (
            f"unknown node shape {name!r}. To fix: use one of {', '.join(known)}, an offer's "
            "id, or describe the node (node_shape; the CLI's --shape-file)"))], "plan request")
    return replace(node_shape_of(found, hardware), name=found.id)


def chosen_layout(choice: LayoutChoice, spec: JobSpec, dims: ModelDims, work: Workload,
                  gpus: int) -> Layout:
    """The Layout a plan request asks for, checked as a job's stated layout is; SpecError
    naming the field (under `layout`) and the fix when it cannot train this model."""
    micro = choice.micro_batch_size or spec.training.micro_batch_size
    dp, batch = choice.dp_replicate * choice.dp_shard, work.global_batch
    errors = []
    if choice.devices != gpus:
        errors.append(FieldError(("layout",), (
            f"dp_replicate x dp_shard x tp x pp = {choice.devices} devices, but {gpus} are "
            "planned for. To fix: make the degrees' product the device count, or leave out "
            "the device count")))
    if batch % (dp * micro):
        fits = divisors(batch // dp) if batch % dp == 0 else []
        errors.append(FieldError(("layout", "micro_batch_size"), (
            f"global_batch_size {batch} does not split into {dp} data-parallel ranks x "
            f"micro-batches of {micro}. To fix: " + (
                f"use a micro_batch_size in {fits}" if fits else
                "use data-parallel degrees whose product divides global_batch_size"))))
    if errors:
        raise SpecError(errors, "plan request")
    recompute = choice.recompute or spec.parallel.recompute_mode
    layout = Layout(choice.dp_replicate, choice.dp_shard, choice.tp, choice.pp,
                    choice.virtual_stages, micro, batch // (dp * micro), recompute,
                    schedule="interleaved_1f1b" if choice.virtual_stages > 1 else "1f1b",
                    sequence_parallel=spec.parallel.sequence_parallel,
                    reduce_scatter_once=spec.parallel.reduce_scatter_once
                    if choice.reduce_scatter_once is None else choice.reduce_scatter_once,
                    zero2=spec.parallel.zero2 if choice.zero2 is None else choice.zero2)
    problems = check_layout(layout, dims.layout_shape(), dims.seq_len, True)
    if problems:
        raise SpecError([FieldError(("layout", p.field[-1]), p.message) for p in problems],
                        "plan request")
    return layout
