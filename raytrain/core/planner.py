"""The planner: every feasible layout for a model on N devices of a kind, with its predicted
step time, tokens/s, MFU, memory per device and dollars per million tokens, best first.

Pure arithmetic over raytrain.catalog.hardware. This module searches (candidates, evaluate,
plan, fastest, suggest); the cost model it searches with, stated below, is
raytrain.core.cost_model:

Parameters and FLOPs. A decoder block holds 2*d^2 + 2*d*d_kv attention weights and
(2 or 3)*d*f MLP weights (3 when gated, as Llama's SwiGLU). FLOPs per token are torchtitan's
convention: 6 x (parameters but the token embedding) + 12 x layers x d x seq (attention
scores, causal masking not discounted), so MFU figures compare with its published ones.

Memory per device. Weights, gradients and AdamW state take 16 bytes per parameter the device
holds (fp32 master, fp32 gradient, two fp32 moments): a pipeline rank holds its stages' layers
(plus embedding or head), tensor parallel divides them by `tp`, FSDP by `dp_shard`. FSDP adds
the root unit (embeddings and head, which FSDP2 keeps gathered from forward to backward) and
two unsharded blocks (current and prefetched) in compute precision, plus the largest unit's
unsharded fp32 gradient (the reduce-scatter's input); DDP adds its gradient buckets (4 bytes
per parameter). Activations per token per layer, in compute precision, as a block saves them
for its backward (tests/pure/test_memory.py measures raytrain's block with saved-tensor
hooks): 8*d + 2*d_kv + (4 or 2)*f values in eager PyTorch (each norm's input, normalised
input and output; q and the attention's output; k and v; SwiGLU's gate, its SiLU, the up
projection and their product, or GELU's input and output), 2*d and f less with fused kernels
or selective recomputation (a norm keeps its input and output, a SwiGLU its two inputs and
its product); sequence parallel divides all of it by `tp` but, as PyTorch runs it, adds the
2*d inputs of the attention and the MLP, gathered whole and saved by the column-wise linears
(a workload with `sp_regather`, Megatron-LM's way, keeps their shards and gathers them again
in the backward: one more all-gather each); tensor parallel without it divides all but the
4*d around the norms; full recomputation keeps only each block's input (d) plus one block's
activations; selective recomputation is counted as half. raytrain's AdamW is the fused
kernel, which updates in place: it adds nothing to the peak.
Layers split over pipeline stages as evenly as they go, the stages a layer short taken from
the ends (raytrain.spec.layout.stage_layers). The layer-micro-batches of activations a
pipeline rank holds at once (raytrain.core.in_flight): its layers once without a pipeline,
m times for GPipe, min(m, pp-r) times on 1F1B's rank r, and under interleaved 1F1B the peak
of a walk through torch's own schedule order, stage by stage. The loss's fp32 log-softmax
sits on the last stage for each microbatch in flight there (m under GPipe, one under 1F1B; a
pipeline stage also keeps its logits), and the backward of one adds two fp32 gradients of its
size (measured: cost_model.loss_bytes_per_logit), whole unless the loss is computed
tensor-parallel; beside them the final norm's input and the head's (whole: gathered under
sequence parallelism). Every pipeline rank is evaluated; the largest counts. A plan fits
when all of it plus the device kind's runtime reserve (CUDA context, NCCL buffers and
allocator slack on a GPU; measured on CPU) stays under 92% of device memory (the rest is
the caching allocator's room for fragmentation); between that and the device's whole memory
it is tight: never chosen by the search, reported with a warning when asked for, and not
bought for by the capacity policy.

Time per step. Compute is timed from the work's shapes (raytrain.core.kernels): each matmul
of a block and the head from its M, N and K against the GPU's best matmul rate (bf16 on
tensor cores, fp32 otherwise), the attention and the memory-bound work between the matmuls,
x4/3 with full recomputation; its constants are fitted to some published runs and validated
on others (benchmarks/published_runs.yaml, BENCHMARKS.md). On CPU the step's FLOPs run at
the measured rate of the whole step. Under a pipeline, each microbatch slot takes the
slowest rank's compute (its blocks, plus the head on the rank with the last stage; the
embedding lookup costs none). Collectives cost
bytes x (n-1)/n / (link bandwidth x efficiency) + latency x (n-1) on the slowest link their
group spans, with ranks laid out tp innermost, then dp_shard, dp_replicate, pp outermost (the
mesh order of raytrain.parallel): a group stays on the intra-node link while its span fits
in a node. Tensor parallel: 8 collective passes of one activation per layer per microbatch
(all-gather and reduce-scatter around attention and MLP, forward and backward; 12 with
recomputation; reduce-scatters at the link's reduce-scatter cost), not overlapped.
Pipeline: one point-to-point activation and gradient per microbatch and stage a rank holds
(interleaving's v stages send v times as often), and the schedule's
bubble: a step is (m + (pp-1)/v) microbatch times. FSDP: all-gather of the blocks' parameters
in forward and again in backward, of the root unit's once (FSDP2 does not reshard the root),
and reduce-scatter of fp32 gradients, per microbatch (once per step under a pipeline, which
keeps parameters gathered), overlapped with compute except one block's worth; plus FSDP2's
copies around each collective (per all-gather the shard in and the whole unit out, per
reduce-scatter the gradients' chunk-cat, its division and the shard's accumulation), not
overlapped, at the device's `copy_bandwidth`. DDP: all-reduce of fp32 gradients once per
step, overlapped with the last backward. HSDP's all-reduce across replicas is not overlapped,
and comes once per step (raytrain holds it back until the last micro-batch). The optimizer
step is memory-bound: fused AdamW reads parameter, gradient and two moments and writes three
of them, 28 bytes per parameter held.

CPU ranks (the `cpu` kind, calibrated on this project's CI machine) differ in five stated
ways: a rank's one thread runs communication and compute one after the other (no overlap);
gloo has no native reduce-scatter (it costs `reduce_scatter_factor` all-gathers); ranks
sharing cores (4 workers at 0.5 CPU on 2 cores) get that share of the FLOP/s and of the
memory copies, and gloo as measured between that many processes (hardware.with_cpu_share; a
rank waiting on gloo leaves its core to another, so it is not simply the share); fixed costs
per block per microbatch (framework dispatch, more of it under DTensor tensor parallelism and
per FSDP unit), measured on a tiny model where they are nearly the whole step, count; and
FSDP's copies go into fresh buffers, new pages from the kernel every time, at a measured rate
several times below a copy into warm memory. `raytrain calibrate` measures this machine's
rate, its fixed cost per block and its fixed cost per optimizer step as the service runs
jobs (raytrain.core.calibration), and the service and `raytrain plan` use them from then on.

    plans = plan(ModelDims.from_gpt(...), Workload(global_batch=512), "h100-sxm", gpus=64)
    plans[0].tokens_per_s, plans[0].reason
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from raytrain.catalog.hardware import GPUS, GiB, NodeShape, node_shape
from raytrain.catalog.prices import usd_for
from raytrain.core.cost_model import (
    USABLE_MEMORY,
    memory_per_device,
    mfu,
    rank_params,
    root_params,
    stage_params,
    step_time,
)
from raytrain.core.dims import ModelDims, Workload
from raytrain.spec.layout import Layout, check_layout, divisors

__all__ = [  # the planner's names, and the cost model's for its callers
    "Plan", "NothingFits", "evaluate", "candidates", "plan", "fastest", "suggest",
    "USABLE_MEMORY", "ModelDims", "Workload", "Layout", "rank_params", "stage_params",
    "root_params", "memory_per_device", "step_time",
]


@dataclass(frozen=True)
class Plan:
    candidate: Layout
    step_s: float
    tokens_per_s: float
    mfu: float
    memory_bytes: float
    memory_limit_bytes: float
    scaling_efficiency: float
    usd_per_million_tokens: float | None
    reason: str
    breakdown: dict[str, float] = field(default_factory=dict)
    device_bytes: float = 0.0  # the device's whole memory, as it reports it

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_limit_bytes

    @property
    def tight(self) -> bool:
        """Over the usable memory (the allocator's reserve kept free) but within the device:
        it may run, as runs tuned to their last GiB do, or fail on fragmentation. The search
        never picks it; a layout asked for is not refused for it."""
        return self.memory_limit_bytes < self.memory_bytes <= self.device_bytes


class NothingFits(ValueError):
    """No layout of this model fits; `suggestions` are the smallest changes that would."""

    def __init__(self, message: str, suggestions: list[str]) -> None:
        super().__init__(message + (" To fix: " + "; or ".join(suggestions) if suggestions
                                    else ""))
        self.suggestions = suggestions


# ------------------------------------------------------------------------------ the model


def evaluate(dims: ModelDims, work: Workload, c: Layout, shape: NodeShape,
             usd_per_device_hour: float | None = None) -> Plan:
    parts = step_time(dims, work, c, shape)
    step_s = parts["total"]
    tokens_step = work.global_batch * dims.seq_len
    tokens_per_s = tokens_step / step_s
    gpu = shape.gpu
    utilisation = mfu(tokens_per_s, dims, c.world_size, gpu, work.precision)
    single = Layout(micro_batch_size=c.micro_batch_size,
                    microbatches=work.global_batch // c.micro_batch_size, recompute=c.recompute)
    one_device = tokens_step / step_time(dims, work, single, shape)["total"]
    memory = memory_per_device(dims, work, c, shape)
    limit = gpu.memory_bytes * USABLE_MEMORY
    usd = None
    if usd_per_device_hour is not None:
        usd = usd_for(usd_per_device_hour, 1e6 / tokens_per_s, c.world_size)
    plan = Plan(c, step_s, tokens_per_s, utilisation, memory, limit,
                tokens_per_s / (c.world_size * one_device), usd, "", parts, gpu.memory_bytes)
    return replace(plan, reason=_reason(plan, gpu.name))


def _reason(plan: Plan, gpu: str) -> str:
    parts = {k: v for k, v in plan.breakdown.items() if k not in ("total", "compute")}
    worst = max(parts, key=lambda k: parts[k]) if parts else "compute"
    share = plan.breakdown["compute"] / plan.breakdown["total"]
    cost = f"; ${plan.usd_per_million_tokens:.3g}/M tokens" \
        if plan.usd_per_million_tokens is not None else ""
    overhead = (f"largest overhead {worst.replace('_', ' ')} "
                f"{plan.breakdown[worst] / plan.breakdown['total']:.0%}")
    memory = f"{plan.memory_bytes / GiB:.1f} of {plan.memory_limit_bytes / GiB:.0f} GiB"
    return (f"{plan.candidate.describe()} on {gpu}: compute {share:.0%} of the step, "
            f"{overhead}; {memory}; MFU {plan.mfu:.0%}{cost}")


# ------------------------------------------------------------------------------ the search


def candidates(dims: ModelDims, work: Workload, world: int,
               shape: NodeShape) -> list[Layout]:
    """Every layout of `world` devices that trains this model and batch: the search spans the
    degrees, stages per rank, micro-batch sizes and recomputation the workload allows, and
    keeps what raytrain.spec.layout.check_layout (the spec's own check) finds no problem in."""
    model = dims.layout_shape()
    built_in = True  # a model the planner has dimensions for is laid out like the built-in GPT

    def trains(layout: Layout) -> bool:
        return not check_layout(layout, model, dims.seq_len, built_in)

    found = []
    # fp8 does not combine with tensor parallelism (raytrain.spec.job says why)
    single = work.data_parallel_only or work.precision == "fp8"
    for tp in divisors(world):
        if tp > work.max_tp or not trains(Layout(tp=tp)) or single and tp > 1:
            continue
        for pp in divisors(world // tp):
            if work.data_parallel_only and pp > 1:
                continue
            dp = world // (tp * pp)
            if work.global_batch % dp:
                continue
            local = work.global_batch // dp
            for shard in divisors(dp):
                for v in (1, 2, 4) if pp > 1 else (1,):
                    for mb in work.micro_batch_options:
                        if local % mb:
                            continue
                        for recompute in work.recompute_options:
                            layout = Layout(
                                dp // shard, shard, tp, pp, v, mb, local // mb, recompute,
                                schedule="interleaved_1f1b" if v > 1 else "1f1b")
                            if not trains(layout):
                                continue
                            found.append(layout)
                            # FSDP2's reduce-scatter held to the last micro-batch: fewer
                            # collectives for unsharded gradients; the ranking decides.
                            if shard > 1 and pp == 1 and local // mb > 1:
                                found.append(replace(layout, reduce_scatter_once=True))
                            # ZeRO-2: parameters kept gathered through the step's backward.
                            if shard > 1 and pp == 1:
                                found.append(replace(layout, zero2=True))
                            # Expert parallelism over some of the sharded ranks (one
                            # replica): the experts never gathered, tokens all-to-all.
                            if dims.experts and shard == dp and tp == pp == 1:
                                found += [replace(layout, ep=ep) for ep in divisors(shard)
                                          if ep > 1 and dims.experts % ep == 0]
    return found


def plan(dims: ModelDims, work: Workload, gpu_kind: str, gpus: int,
         usd_per_device_hour: float | None = None, shape: NodeShape | None = None,
         keep: int = 20) -> list[Plan]:
    """Feasible plans, fastest first (ties: cheaper memory). Raises NothingFits with the
    smallest changes that would fit."""
    shape = shape or node_shape(gpu_kind)
    plans = [evaluate(dims, work, c, shape, usd_per_device_hour)
             for c in candidates(dims, work, gpus, shape)]
    fitting = sorted((p for p in plans if p.fits), key=lambda p: (p.step_s, p.memory_bytes))
    if not fitting:
        raise NothingFits(_nothing_fits_message(dims, work, gpus, shape, plans),
                          suggest(dims, work, gpu_kind, gpus))
    return fitting[:keep]


def fastest(dims: ModelDims, work: Workload, gpus: int, shape: NodeShape) -> Plan | None:
    """The fastest plan that fits, or None (no suggestions: for searches over many shapes)."""
    fitting = [p for p in (evaluate(dims, work, c, shape, None)
                           for c in candidates(dims, work, gpus, shape)) if p.fits]
    return min(fitting, key=lambda p: (p.step_s, p.memory_bytes), default=None)


def _nothing_fits_message(dims: ModelDims, work: Workload, gpus: int, shape: NodeShape,
                          plans: list[Plan]) -> str:
    if not plans:
        return (f"no layout of {gpus} devices divides global_batch_size={work.global_batch} "
                f"and the model's heads ({dims.num_heads}) and layers ({dims.num_layers}).")
    least = min(plans, key=lambda p: p.memory_bytes)
    return (f"no layout of a {dims.params / 1e9:.2f}B-parameter model fits {gpus} x "
            f"{shape.gpu.name} ({shape.gpu.memory_bytes / GiB:.0f} GiB): the leanest, "
            f"{least.candidate.describe()}, needs {least.memory_bytes / GiB:.1f} GiB per device.")


def suggest(dims: ModelDims, work: Workload, gpu_kind: str, gpus: int) -> list[str]:
    """The smallest changes that make something fit: more devices of the kind, a device kind
    with more memory, recomputation, a smaller micro-batch."""
    found = []
    for factor in (2, 4, 8, 16, 32, 64):
        bigger = gpus * factor
        if _any_fits(dims, work, gpu_kind, bigger):
            found.append(f"use {bigger} x {gpu_kind} (or more)")
            break
        larger_batch = replace(work, global_batch=work.global_batch * factor)
        if _any_fits(dims, larger_batch, gpu_kind, bigger):
            found.append(f"use {bigger} x {gpu_kind} with global_batch_size "
                         f"{larger_batch.global_batch} (pipeline stages need microbatches)")
            break
    current = GPUS[gpu_kind].memory_bytes
    for kind, spec in sorted(GPUS.items(), key=lambda kv: kv[1].memory_bytes):
        if kind != "cpu" and spec.memory_bytes > current and _any_fits(dims, work, kind, gpus):
            found.append(f"use {gpus} x {kind} ({spec.memory_bytes / GiB:.0f} GiB)")
            break
    if "full" not in work.recompute_options:
        relaxed = replace(work, recompute_options=(*work.recompute_options, "full"))
        if _any_fits(dims, relaxed, gpu_kind, gpus):
            found.append("turn on activation recomputation")
    if 1 not in work.micro_batch_options:
        relaxed = replace(work, micro_batch_options=(1, *work.micro_batch_options))
        if _any_fits(dims, relaxed, gpu_kind, gpus):
            found.append("use micro_batch_size 1")
    return found


def _any_fits(dims: ModelDims, work: Workload, gpu_kind: str, gpus: int) -> bool:
    shape = node_shape(gpu_kind)
    return any(memory_per_device(dims, work, c, shape) <= shape.gpu.memory_bytes * USABLE_MEMORY
               for c in candidates(dims, work, gpus, shape))
