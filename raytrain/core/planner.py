"""The planner: every feasible layout for a model on N devices of a kind, with its predicted
step time, tokens/s, MFU, memory per device and dollars per million tokens, best first.

Pure arithmetic over raytrain.core.hardware. The model of a training step, stated:

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
per parameter). Activations per token per layer, in compute precision:
8*d + 2*d_kv + (3 or 2)*f values (norm inputs and outputs, q/k/v, attention output, the MLP's
hidden activations); sequence parallel divides all of it by `tp`, tensor parallel without it
all but the 4*d around the norms; full recomputation keeps only each block's input (d) plus
one block's activations; selective recomputation is counted as half. raytrain's AdamW is
the fused kernel, which updates in place: it adds nothing to the peak.
Microbatches in flight on pipeline rank r: one without a pipeline, m for GPipe, min(m, pp-r)
for 1F1B, and min(m, pp) x (1 + (pp-1)/(pp*v)) for interleaved 1F1B (Narayanan et al.,
2021). The head's logits (and their fp32 log-softmax) sit on the last stage for each
microbatch in flight there (m under GPipe, one under 1F1B), plus one fp32 gradient, whole
unless the loss is computed tensor-parallel. The first and the last pipeline rank are
evaluated; the larger counts. A plan fits when all of it plus the device kind's runtime
reserve (CUDA context, NCCL buffers and allocator slack on a GPU; measured on CPU) stays
under 92% of device memory.

Time per step. Compute runs at the device's calibrated `achievable` fraction of peak (bf16 on
tensor cores, fp32 otherwise), x4/3 on matmuls with full recomputation; under a pipeline,
each microbatch slot takes the slowest rank's compute (its blocks, plus the head on the rank
with the last stage; the embedding lookup costs none). Collectives cost
bytes x (n-1)/n / (link bandwidth x efficiency) + latency x (n-1) on the slowest link their
group spans, with ranks laid out tp innermost, then dp_shard, dp_replicate, pp outermost (the
mesh order of raytrain.parallel): a group stays on the intra-node link while its span fits
in a node. Tensor parallel: 8 collective passes of one activation per layer per microbatch
(all-gather and reduce-scatter around attention and MLP, forward and backward; 12 with
recomputation; reduce-scatters at the link's reduce-scatter cost), not overlapped.
Pipeline: one point-to-point activation and gradient per microbatch, and the schedule's
bubble: a step is (m + (pp-1)/v) microbatch times. FSDP: all-gather of the blocks' parameters
in forward and again in backward, of the root unit's once (FSDP2 does not reshard the root),
and reduce-scatter of fp32 gradients, per microbatch (once per step under a pipeline, which
keeps parameters gathered), overlapped with compute except one block's worth; plus FSDP2's
copies around each collective (per all-gather the shard in and the whole unit out, per
reduce-scatter the gradients' chunk-cat, its division and the shard's accumulation), not
overlapped, at the device's `copy_bandwidth`. DDP: all-reduce of fp32 gradients once per
step, overlapped with the last backward. HSDP's all-reduce across replicas is not overlapped,
and comes after every microbatch without a pipeline. The optimizer step is
memory-bound: fused AdamW reads parameter, gradient and two moments and writes three of them,
28 bytes per parameter held.

CPU ranks (the `cpu` kind, calibrated on this project's CI machine) differ in five stated
ways: a rank's one thread runs communication and compute one after the other (no overlap);
gloo has no native reduce-scatter (it costs `reduce_scatter_factor` all-gathers); ranks
sharing cores (4 workers at 0.5 CPU on 2 cores) get that share of the FLOP/s and of the
memory copies, and gloo as measured between that many processes (hardware.with_cpu_share; a
rank waiting on gloo leaves its core to another, so it is not simply the share); fixed costs
per block per microbatch (framework dispatch, more of it under DTensor tensor parallelism and
per FSDP unit), measured on a tiny model where they are nearly the whole step, count; and
FSDP's copies go into fresh buffers, new pages from the kernel every time, at a measured rate
several times below a copy into warm memory.

    plans = plan(ModelDims.from_gpt(...), Workload(global_batch=512), "h100-sxm", gpus=64)
    plans[0].tokens_per_s, plans[0].reason
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from raytrain.core.hardware import GPUS, GiB, Link, NodeShape, node_shape
from raytrain.core.layout import Layout, divisors, stage_layers, stages_of_rank

USABLE_MEMORY = 0.92


@dataclass(frozen=True)
class ModelDims:
    num_layers: int
    dim: int
    num_heads: int
    ffn_dim: int
    vocab_size: int
    seq_len: int
    num_kv_heads: int | None = None
    gated_mlp: bool = False
    position_rows: int = 0  # learned position embeddings (the built-in GPT); 0 for RoPE

    @staticmethod
    def from_gpt(num_layers: int, dim: int, num_heads: int, ffn_dim: int, vocab_size: int,
                 seq_len: int, max_seq_len: int) -> ModelDims:
        return ModelDims(num_layers, dim, num_heads, ffn_dim, vocab_size, seq_len,
                         position_rows=max_seq_len)

    @property
    def kv_dim(self) -> int:
        return self.dim * (self.num_kv_heads or self.num_heads) // self.num_heads

    @property
    def block_params(self) -> int:
        attention = 2 * self.dim * self.dim + 2 * self.dim * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * self.dim * self.ffn_dim
        return attention + mlp + 2 * self.dim

    @property
    def embedding_params(self) -> int:
        return (self.vocab_size + self.position_rows) * self.dim

    @property
    def head_params(self) -> int:
        return self.vocab_size * self.dim + self.dim

    @property
    def params(self) -> int:
        return self.num_layers * self.block_params + self.embedding_params + self.head_params

    @property
    def flops_per_token(self) -> float:
        dense = self.params - self.embedding_params
        return 6.0 * dense + 12.0 * self.num_layers * self.dim * self.seq_len

    @property
    def activation_values_per_token_layer(self) -> int:
        return 8 * self.dim + 2 * self.kv_dim + (3 if self.gated_mlp else 2) * self.ffn_dim


@dataclass(frozen=True)
class Workload:
    global_batch: int  # sequences per optimizer step
    precision: str = "bf16"  # compute precision: bf16 | fp32
    recompute_options: tuple[str, ...] = ("none", "full")
    micro_batch_options: tuple[int, ...] = (1, 2, 4, 8, 16)
    loss_parallel: bool = False  # logits sharded over tp for the loss (torchtitan: yes)
    max_tp: int = 16
    compute_speedup: float = 1.0  # e.g. torch.compile or float8 gains, stated by the caller

    @property
    def act_bytes(self) -> int:
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class Candidate:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int
    virtual_stages: int
    micro_batch: int
    microbatches: int
    recompute: str
    gpipe: bool = False  # the planner proposes 1F1B; a user's GPipe layout is evaluated too

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def schedule(self) -> str:
        if self.gpipe:
            return "gpipe"
        return "interleaved_1f1b" if self.virtual_stages > 1 else "1f1b"

    @property
    def wrapper(self) -> str:
        """The data-parallel wrapper raytrain uses for these degrees (Layout decides)."""
        return Layout(self.dp_replicate, self.dp_shard, self.tp, self.pp).data_parallel_wrapper

    def describe(self) -> str:
        parts = [f"{n}{getattr(self, n)}" for n in ("dp_replicate", "dp_shard", "tp", "pp")
                 if getattr(self, n) > 1] or ["1 device"]
        if self.pp > 1:
            parts.append(f"{self.schedule}" + (f" v{self.virtual_stages}"
                                               if self.virtual_stages > 1 else ""))
        parts.append(f"mb{self.micro_batch}x{self.microbatches}")
        if self.recompute != "none":
            parts.append(f"recompute {self.recompute}")
        return " ".join(parts)


@dataclass(frozen=True)
class Plan:
    candidate: Candidate
    step_s: float
    tokens_per_s: float
    mfu: float
    memory_bytes: float
    memory_limit_bytes: float
    scaling_efficiency: float
    usd_per_million_tokens: float | None
    reason: str
    breakdown: dict[str, float] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_limit_bytes


class NothingFits(ValueError):
    """No layout of this model fits; `suggestions` are the smallest changes that would."""

    def __init__(self, message: str, suggestions: list[str]) -> None:
        super().__init__(message + (" To fix: " + "; or ".join(suggestions) if suggestions
                                    else ""))
        self.suggestions = suggestions


# ------------------------------------------------------------------------------ the model


def _collective_s(nbytes: float, ranks: int, link: Link) -> float:
    """One all-gather or reduce-scatter pass of `nbytes` (the whole tensor) over `ranks`."""
    if ranks <= 1:
        return 0.0
    share = (ranks - 1) / ranks
    return nbytes * share / (link.bandwidth * link.efficiency) + link.latency_s * (ranks - 1)


def _link_for_span(span: int, shape: NodeShape) -> Link:
    return shape.intra if span <= shape.gpus_per_node else shape.inter


@lru_cache(maxsize=4096)  # the search asks for the same few ranks of one model many times
def rank_params(dims: ModelDims, pp: int, v: int, rank: int) -> tuple[int, int, bool]:
    """(parameters, layers, holds the last stage) of pipeline rank `rank`: its stages' layers
    plus the embeddings or head, split as raytrain.parallel splits the built-in GPT."""
    stages = pp * v
    layers = stage_layers(dims.num_layers, stages)
    held = count = 0
    mine = stages_of_rank(rank, pp, stages)
    for stage in mine:
        count += len(layers[stage])
        held += len(layers[stage]) * dims.block_params
        held += dims.embedding_params if stage == 0 else 0
        held += dims.head_params if stage == stages - 1 else 0
    return held, count, (stages - 1) in mine


@lru_cache(maxsize=4096)
def stage_params(dims: ModelDims, pp: int, v: int) -> int:
    """Parameters on the busiest pipeline rank."""
    return max(rank_params(dims, pp, v, rank)[0] for rank in range(pp))


@lru_cache(maxsize=4096)
def stage_flops_per_token(dims: ModelDims, pp: int, v: int) -> float:
    """FLOPs per token of the slowest pipeline rank, which sets the pace of every microbatch:
    its blocks, plus the head on the rank holding the last stage (the embedding lookup has
    none). Without a pipeline, dims.flops_per_token."""
    per_block = 6.0 * dims.block_params + 12.0 * dims.dim * dims.seq_len
    slowest = 0.0
    for rank in range(pp):
        _, layers, last = rank_params(dims, pp, v, rank)
        slowest = max(slowest, layers * per_block + (6.0 * dims.head_params if last else 0.0))
    return slowest


def root_params(dims: ModelDims, c: Candidate) -> float:
    """Parameters of FSDP's root unit on a rank (embeddings, final norm, head), without a
    pipeline; its tensor-parallel share."""
    return (dims.embedding_params + dims.head_params) / c.tp


def memory_per_device(dims: ModelDims, work: Workload, c: Candidate, shape: NodeShape) -> float:
    """The most any rank needs: the first and the last pipeline rank bound the rest (earlier
    stages are never smaller, and the first rank has the most microbatches in flight)."""
    ranks = {0, c.pp - 1}
    worst = max(_rank_memory(dims, work, c, rank) for rank in ranks)
    return shape.gpu.runtime_reserve_bytes + worst


def _rank_memory(dims: ModelDims, work: Workload, c: Candidate, rank: int) -> float:
    params, layers_here, last = rank_params(dims, c.pp, c.virtual_stages, rank)
    held = params / c.tp
    state = held / c.dp_shard * 16
    param_bytes = work.act_bytes
    block_held = dims.block_params / c.tp
    if c.wrapper == "fsdp":
        if c.pp > 1:  # parameters stay gathered between microbatches
            state += held * param_bytes
        else:
            # The root unit (embeddings, final norm, head) stays gathered from forward to
            # backward (FSDP2 does not reshard the root), two blocks are gathered at a time
            # (current and prefetched), and the unit being reduced has its whole fp32
            # gradient as the reduce-scatter's input.
            root_held = root_params(dims, c)
            state += (root_held + 2 * block_held) * param_bytes
            state += max(root_held, block_held) * 4
    elif c.wrapper == "ddp":
        state += held * 4  # gradient buckets
    tokens = c.micro_batch * dims.seq_len
    per_layer = dims.activation_values_per_token_layer
    if c.tp > 1:
        per_layer = per_layer / c.tp  # sequence parallel, raytrain's default with tp
    full_layer_bytes = tokens * per_layer * work.act_bytes
    if c.recompute == "full":
        layer_bytes = tokens * dims.dim * work.act_bytes / c.tp
        extra_once = full_layer_bytes
    elif c.recompute == "selective":
        layer_bytes, extra_once = full_layer_bytes / 2, 0.0
    else:
        layer_bytes, extra_once = full_layer_bytes, 0.0
    # Microbatches whose activations this rank holds at once: 1F1B's rank r warms up with
    # pp - r forwards; GPipe runs all m forwards first; interleaving adds a share.
    if c.pp == 1:
        in_flight = 1.0
    elif c.gpipe:
        in_flight = float(c.microbatches)
    else:
        in_flight = float(min(c.microbatches, c.pp - rank))
        if c.virtual_stages > 1:
            in_flight = min(c.microbatches, c.pp) * (1 + (c.pp - 1) / (c.pp * c.virtual_stages))
    activations = in_flight * layers_here * layer_bytes + extra_once
    # The last stage's logits (compute precision) and fp32 log-softmax stay until their
    # microbatch's backward (all m of them under GPipe), plus one fp32 gradient of them.
    logits = 0.0
    if last:
        logits_in_flight = c.microbatches if (c.gpipe and c.pp > 1) else 1
        logits = tokens * dims.vocab_size * ((work.act_bytes + 4) * logits_in_flight + 4)
        if work.loss_parallel:
            logits /= c.tp
    # raytrain's fused AdamW updates in place: no temporaries after the backward pass.
    return state + activations + logits


def step_time(dims: ModelDims, work: Workload, c: Candidate,
              shape: NodeShape) -> dict[str, float]:
    """Seconds per optimizer step, by part (compute, tp, pp, bubble, dp, optimizer, total)."""
    gpu = shape.gpu
    peak = gpu.flops(work.precision) * gpu.achievable * work.compute_speedup
    tokens = c.micro_batch * dims.seq_len
    matmul_flops = tokens * stage_flops_per_token(dims, c.pp, c.virtual_stages)
    if c.recompute == "full":
        matmul_flops *= 4 / 3
    elif c.recompute == "selective":
        matmul_flops *= 1.05
    layers_here = math.ceil(dims.num_layers / c.pp)
    compute_mb = matmul_flops / c.tp / peak + layers_here * gpu.block_overhead_s
    tp_passes = 12 if c.recompute == "full" else 8
    act_bytes_mb = tokens * dims.dim * work.act_bytes
    tp_link = _link_for_span(c.tp, shape)
    tp_mb = 0.0
    if c.tp > 1:
        # Half the passes are all-gathers, half reduce-scatters.
        one_pass = _collective_s(act_bytes_mb, c.tp, tp_link)
        tp_mb = layers_here * (tp_passes / 2) * (
            one_pass * (1 + tp_link.reduce_scatter_factor))
        tp_mb += layers_here * gpu.tp_block_overhead_s
    pp_link = _link_for_span(c.world, shape) if c.pp > 1 else shape.intra
    pp_mb = 0.0
    if c.pp > 1:
        message = act_bytes_mb / c.tp
        pp_mb = 2 * (message / (pp_link.bandwidth * pp_link.efficiency) + pp_link.latency_s)
    held = stage_params(dims, c.pp, c.virtual_stages) / c.tp
    shard_link = _link_for_span(c.tp * c.dp_shard, shape)
    fsdp_mb = 0.0
    dp_step = 0.0
    overlap = gpu.overlaps_communication
    if c.wrapper == "fsdp":
        groups = layers_here + 1  # one FSDP unit per block, one at the root
        gather = _collective_s(held * work.act_bytes, c.dp_shard, shard_link) + \
            shard_link.latency_s * (groups - 1) * (c.dp_shard - 1)
        # Each unit's fixed cost (its hooks, collectives' set-up), once per microbatch.
        units = groups * gpu.fsdp_unit_overhead_s
        scatter = _collective_s(held * 4, c.dp_shard, shard_link) * \
            shard_link.reduce_scatter_factor + shard_link.latency_s * (groups - 1)
        # What FSDP2 copies around its collectives (torch 2.13, _fsdp_collectives.py), per
        # all-gather: the local shard in and the whole unit out into the parameters (with one
        # shard, HSDP's replicas, no collective: the unit out only); per reduce-scatter: the
        # gradients into one buffer (chunk-cat) and divided there, the reduced shard out (one
        # shard: copied; else the collective writes it) and added to the sharded gradient.
        # They run on the compute stream (CPU: the rank's thread).
        n = c.dp_shard
        gather_copies = (1 + 1 / n if n > 1 else 1.0) * work.act_bytes
        scatter_copies = (2 + 1 / n + (1 if n == 1 else 0)) * 4
        if c.pp > 1:
            traffic = gather + scatter
            hidden = c.microbatches * compute_mb if overlap else 0.0
            dp_step += max(0.0, traffic - hidden) + (traffic / groups if overlap else 0.0)
            dp_step += held * (gather_copies + scatter_copies) / gpu.copy_bandwidth + units
        else:
            # Blocks are gathered for forward and again for backward; the root is not
            # resharded after forward (FSDP2 keeps it for the backward that follows).
            regathered = 1 - root_params(dims, c) / held
            per_mb = (1 + regathered) * gather + scatter
            hidden = compute_mb if overlap else 0.0
            fsdp_mb = max(0.0, per_mb - hidden) + (per_mb / groups if overlap else 0.0)
            fsdp_mb += held * ((1 + regathered) * gather_copies + scatter_copies) \
                / gpu.copy_bandwidth + units
    if c.dp_replicate > 1:
        replicate_link = _link_for_span(c.world // c.pp, shape)
        grads = held / c.dp_shard * 4
        allreduce = 2 * _collective_s(grads, c.dp_replicate, replicate_link)
        if c.wrapper == "ddp" and overlap:
            backward = compute_mb * 2 / 3
            dp_step += max(0.0, allreduce - backward) + allreduce / max(1, layers_here)
        elif c.wrapper == "fsdp" and c.pp == 1:
            # HSDP reduces across replicas after every microbatch's backward (raytrain does not
            # hold gradient sync back during accumulation), not hidden.
            fsdp_mb += allreduce
        else:
            dp_step += allreduce
    per_mb = compute_mb + tp_mb + pp_mb + fsdp_mb
    slots = c.microbatches + ((c.pp - 1) / c.virtual_stages if c.pp > 1 else 0.0)
    optimizer = held / c.dp_shard * 28 / gpu.memory_bandwidth
    total = per_mb * slots + dp_step + optimizer
    return {
        "compute": compute_mb * c.microbatches,
        "tensor_parallel": tp_mb * c.microbatches,
        "pipeline_p2p": pp_mb * c.microbatches,
        "bubble": per_mb * (slots - c.microbatches),
        "data_parallel": fsdp_mb * c.microbatches + dp_step,
        "optimizer": optimizer,
        "total": total,
    }


def evaluate(dims: ModelDims, work: Workload, c: Candidate, shape: NodeShape,
             usd_per_device_hour: float | None = None) -> Plan:
    parts = step_time(dims, work, c, shape)
    step_s = parts["total"]
    tokens_step = work.global_batch * dims.seq_len
    tokens_per_s = tokens_step / step_s
    gpu = shape.gpu
    mfu = tokens_per_s * dims.flops_per_token / (c.world * gpu.flops(work.precision))
    single = Candidate(1, 1, 1, 1, 1, c.micro_batch, work.global_batch // c.micro_batch,
                       c.recompute)
    one_device = tokens_step / step_time(dims, work, single, shape)["total"]
    memory = memory_per_device(dims, work, c, shape)
    limit = gpu.memory_bytes * USABLE_MEMORY
    usd = None
    if usd_per_device_hour is not None:
        usd = usd_per_device_hour * c.world / 3600 / tokens_per_s * 1e6
    plan = Plan(c, step_s, tokens_per_s, mfu, memory, limit,
                tokens_per_s / (c.world * one_device), usd, "", parts)
    return replace(plan, reason=_reason(plan, gpu.name))


def _reason(plan: Plan, gpu: str) -> str:
    parts = {k: v for k, v in plan.breakdown.items() if k not in ("total", "compute")}
    worst = max(parts, key=parts.get) if parts else "compute"
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
               shape: NodeShape) -> list[Candidate]:
    heads = math.gcd(dims.num_heads, dims.num_kv_heads or dims.num_heads)
    found = []
    for tp in divisors(world):
        if tp > work.max_tp or heads % tp or dims.ffn_dim % tp:
            continue
        for pp in divisors(world // tp):
            if pp > dims.num_layers:
                continue
            dp = world // (tp * pp)
            if work.global_batch % dp:
                continue
            local = work.global_batch // dp
            for shard in divisors(dp):
                replicate = dp // shard
                for v in (1, 2, 4) if pp > 1 else (1,):
                    if pp * v > dims.num_layers:
                        continue
                    for mb in work.micro_batch_options:
                        if local % mb:
                            continue
                        m = local // mb
                        if pp > 1 and (m < pp or (v > 1 and m % pp)):
                            continue
                        for recompute in work.recompute_options:
                            found.append(Candidate(replicate, shard, tp, pp, v, mb, m,
                                                   recompute))
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
