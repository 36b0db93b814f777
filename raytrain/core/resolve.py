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

from raytrain.catalog.hardware import CATALOG_VERSION, node_shape, with_cpu_share
from raytrain.core.planner import ModelDims, NothingFits, Plan, Workload, evaluate, plan
from raytrain.errors import FieldError, SpecError
from raytrain.spec import JobSpec, PlanRequest, PlanResponse, PlanRow, PlanSummary
from raytrain.spec.layout import Layout


def planner_inputs(spec: JobSpec, gpus: int | None = None, accelerator: str | None = None
                   ) -> tuple[ModelDims, Workload, str, int]:
    """What the planner needs to know of a job (built-in GPT only)."""
    gpt = spec.model.gpt
    dims = ModelDims.from_gpt(gpt.num_layers, gpt.dim, gpt.num_heads, gpt.hidden_dim,
                              gpt.vocab_size, spec.data.seq_len, gpt.max_seq_len)
    work = Workload(
        global_batch=spec.training.global_batch_size,
        precision="fp32" if spec.training.precision == "fp32" else "bf16",
        recompute_options=("full",) if spec.parallel.activation_checkpointing else ("none",),
        micro_batch_options=(spec.training.micro_batch_size,),
    )
    kind = accelerator or spec.resources.device_kind or "cpu"
    return dims, work, kind, gpus or spec.resources.num_workers


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
    except NothingFits as exc:
        fixes = "; ".join(exc.suggestions)
        raise SpecError([FieldError(here, f"{exc}" + (f" To fix: {fixes}" if fixes else ""))]
                        ) from None
    layout = replace(best, sequence_parallel=spec.parallel.sequence_parallel)
    problems = spec.layout_problems(layout)
    if problems:
        raise SpecError([FieldError(p.field, f"with the planner's layout "
                                    f"({layout.describe()}): {p.message}") for p in problems])
    return layout


def predicted(spec: JobSpec, layout: Layout) -> Plan | None:
    """The planner's figures for `layout`, when the model is the built-in GPT and the device
    kind is known."""
    if spec.model.kind != "gpt" or spec.resources.device_kind is None:
        return None
    dims, work, kind, _ = planner_inputs(spec)
    shape = with_cpu_share(node_shape(kind), spec.resources.cpus_per_worker)
    return evaluate(dims, work, layout, shape)


def plan_summary(spec: JobSpec, layout: Layout | None = None) -> PlanSummary:
    """What is stored with the job: its layout, and the planner's figures for it."""
    layout = layout or job_layout(spec)
    figures = predicted(spec, layout)
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


def rank_plans(request: PlanRequest) -> PlanResponse:
    """POST /v1/plans: the ranked plans for a request; raises NothingFits with the smallest
    changes that would fit."""
    spec = request.spec
    dims, work, kind, gpus = planner_inputs(spec, request.gpus, request.accelerator)
    # Ranking searches micro-batch sizes and recomputation too, not only the spec's own.
    work = replace(work, micro_batch_options=(1, 2, 4, 8, 16), recompute_options=("none", "full"))
    plans = plan(dims, work, kind, gpus, request.usd_per_gpu_hour, keep=request.keep)
    rows = [
        PlanRow(
            rank=index, layout=p.candidate.describe(),
            **{k: v for k, v in asdict(p.candidate).items() if k in PlanRow.model_fields},
            step_s=p.step_s, tokens_per_s=p.tokens_per_s, mfu=p.mfu,
            memory_gib=p.memory_bytes / 2**30, memory_limit_gib=p.memory_limit_bytes / 2**30,
            scaling_efficiency=p.scaling_efficiency,
            usd_per_million_tokens=p.usd_per_million_tokens, reason=p.reason,
        )
        for index, p in enumerate(plans, start=1)
    ]
    return PlanResponse(accelerator=kind, gpus=gpus, catalog_version=CATALOG_VERSION, plans=rows)
