"""What the service computes once for a job at submit, from its spec: the plan summary it
stores with the job (layout, the planner's predicted step time, throughput and memory,
gradient accumulation, tokens per step, collective backend).

    job.plan = plan_summary(spec)
"""

from __future__ import annotations

from typing import Any

from raytrain.spec import JobSpec, PlanSummary


def predictions(spec: JobSpec) -> dict[str, Any]:
    predicted = spec.predicted()
    if predicted is None:
        return {}
    return {
        "predicted_step_s": predicted.step_s,
        "predicted_tokens_per_s": predicted.tokens_per_s,
        "predicted_memory_gib": predicted.memory_bytes / 2**30,
        "reason": predicted.reason,
    }


def plan_summary(spec: JobSpec) -> PlanSummary:
    layout = spec.layout
    return PlanSummary(
        strategy=spec.parallel.strategy,
        layout={
            "dp_replicate": layout.dp_replicate,
            "dp_shard": layout.dp_shard,
            "tp": layout.tp,
            "pp": layout.pp,
            "virtual_stages": layout.virtual_stages,
            "microbatches": layout.microbatches,
        },
        description=layout.describe(),
        **predictions(spec),
        grad_accum_steps=spec.grad_accum_steps,
        tokens_per_step=spec.tokens_per_step,
        backend="nccl" if spec.resources.use_gpu else "gloo",
    )
