"""The planner's cost model (raytrain.core.planner searches with it): a model's dimensions and a
workload (raytrain.core.dims), one candidate layout, and what that layout costs per device: memory
(`memory_per_device`) and time per optimizer step (`step_time`), from the GPU's peak rate and
memory, the links it spans, and the collectives each parallel axis makes.

    c = Layout(dp_replicate=8, micro_batch_size=4, microbatches=2)  # raytrain.spec.layout
    memory_per_device(dims, work, c, shape) -> bytes;  step_time(dims, work, c, shape) -> s
"""

from __future__ import annotations

import math
from functools import lru_cache

from raytrain.catalog.hardware import GPUKind, Link, NodeShape
from raytrain.core.dims import ModelDims, Workload
from raytrain.core.in_flight import layers_in_flight
from raytrain.core.kernels import (
    MicrobatchShape,
    microbatch_compute_s,
)
from raytrain.spec.layout import (
    Layout,
    one_device_shards,
    stage_layers,
    stages_of_rank,
)

USABLE_MEMORY = 0.92
# The fp32 logits one chunk of the built-in model's loss holds: raytrain.models.gpt's
# LOSS_CHUNK_BYTES (core imports no models; tests/pure/test_memory.py holds them equal).
LOSS_CHUNK_BYTES = 256 * 2**20


def mfu(tokens_per_s: float, dims: ModelDims, devices: int, gpu: GPUKind,
        precision: str) -> float:
    """Model FLOPs utilisation: tokens/s times the model's FLOPs per token over the devices'
    peak at `precision` (the planner's for a predicted throughput, the service's for a
    measured one)."""
    return tokens_per_s * dims.flops_per_token / (devices * gpu.flops(precision))


def _collective_s(nbytes: float, ranks: int, link: Link) -> float:
    """One all-gather or reduce-scatter pass of `nbytes` (the whole tensor) over `ranks`."""
    if ranks <= 1:
        return 0.0
    share = (ranks - 1) / ranks
    return nbytes * share / (link.bandwidth * link.efficiency) + _latency_s(link, ranks)


def _latency_s(link: Link, ranks: int) -> float:
    """The fixed cost of one collective over `ranks`: one latency (NCCL pipelines its steps),
    or one per ring step where each waits for the last (gloo)."""
    return link.latency_s * (ranks - 1 if link.latency_per_step else 1)


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
    if dims.tied_embeddings and 0 in mine and stages - 1 in mine:  # one table for both
        held -= dims.vocab_size * dims.dim
    return held, count, (stages - 1) in mine


@lru_cache(maxsize=4096)
def stage_params(dims: ModelDims, pp: int, v: int) -> int:
    """Parameters on the busiest pipeline rank."""
    return max(rank_params(dims, pp, v, rank)[0] for rank in range(pp))


def rank_flops_per_token(dims: ModelDims, pp: int, v: int, rank: int) -> float:
    """FLOPs per token of pipeline rank `rank`: its blocks, plus the head on the rank holding
    the last stage (the embedding lookup has none)."""
    _, layers, last = rank_params(dims, pp, v, rank)
    per_block = 6.0 * dims.active_block_params + 12.0 * dims.q_dim * dims.seq_len
    return layers * per_block + (6.0 * dims.head_params if last else 0.0)


def slowest_rank_compute_s(dims: ModelDims, work: Workload, c: Layout, gpu: GPUKind) -> float:
    """One micro-batch's compute on the slowest pipeline rank (raytrain.core.kernels), which
    sets the pace of every slot; without a pipeline, the one rank's."""
    shape = MicrobatchShape(c.micro_batch_size, c.tp, c.recompute, c.sequence_parallel)
    ranks = {(*rank_params(dims, c.pp, c.virtual_stages, rank)[1:],
              rank_flops_per_token(dims, c.pp, c.virtual_stages, rank)) for rank in range(c.pp)}
    return max(microbatch_compute_s(dims, work, gpu, shape, layers, last, flops)
               for layers, last, flops in ranks)


def root_params(dims: ModelDims, c: Layout) -> float:
    """Parameters of FSDP's root unit on a rank (embeddings, final norm, head), without a
    pipeline; its tensor-parallel share."""
    return (dims.embedding_params + dims.head_params) / c.tp


def memory_per_device(dims: ModelDims, work: Workload, c: Layout, shape: NodeShape) -> float:
    """The most any pipeline rank needs (with the ends' stages a layer short, the first rank
    need not be the fullest)."""
    worst = max(_rank_memory(dims, work, c, rank) for rank in range(c.pp))
    return shape.gpu.runtime_reserve_bytes + worst


def _rank_memory(dims: ModelDims, work: Workload, c: Layout, rank: int) -> float:
    params, _, last = rank_params(dims, c.pp, c.virtual_stages, rank)
    held = params / c.tp
    share = work.trainable_share  # of `held`, with gradients and optimizer state
    per_param = 16 * share + work.frozen_param_bytes * (1 - share)
    # Expert parallelism: the experts split over ep ranks (replicated over the expert
    # groups, never gathered), the rest fully sharded as usual.
    experts = dims.expert_params if c.ep_enabled else 0
    held -= experts
    state = held / c.dp_shard * per_param + experts / c.ep * per_param
    param_bytes = work.act_bytes
    block_held = (dims.block_params - experts / dims.num_layers) / c.tp
    # bf16 on one device: FSDP2 over a mesh of one for its bf16 parameters
    # (raytrain.parallel.parallelize), which holds what a sharded layout's gathers hold.
    if c.data_parallel_wrapper == "fsdp" or one_device_shards(
            c, work.precision, lora=work.frozen_weights):
        if c.pp_enabled:  # parameters stay gathered between microbatches
            state += held * param_bytes
        else:
            # The root unit (embeddings, final norm, head) stays gathered from forward to
            # backward (FSDP2 does not reshard the root), two blocks are gathered at a time
            # (current and prefetched), and the unit being reduced has its whole fp32
            # gradient as the reduce-scatter's input; with the reduce-scatter held to the
            # last micro-batch, every unit's whole fp32 gradient stays until then.
            # ZeRO-2 (zero2): every unit stays gathered from its forward to its backward, so
            # at the backward's start the whole model's parameters are.
            root_held = root_params(dims, c)
            state += (held if c.zero2 else root_held + 2 * block_held) * param_bytes
            state += (held * 4 if c.reduce_scatter_once else
                      max(root_held, block_held) * 4) * share
    elif c.data_parallel_wrapper == "ddp":
        state += held * 4 * share  # gradient buckets
    tokens = c.micro_batch_size * dims.seq_len
    # Selective recomputation recomputes the elementwise work, as fused kernels avoid saving it.
    fused = work.fused_elementwise or c.recompute == "selective"
    per_layer = dims.activation_values_on_rank(c.tp, c.sequence_parallel,
                                               dims.saved_values_per_token_layer(fused))
    if c.tp_enabled and c.sequence_parallel and not work.sp_regather:
        # PyTorch's sequence parallelism all-gathers the attention's and the MLP's input to
        # the whole sequence, and the column-wise linears save it whole for their backward.
        per_layer += 2 * dims.dim * (1 - 1 / c.tp)
    full_layer_bytes = tokens * per_layer * work.act_bytes
    if c.recompute == "full":
        layer_bytes = tokens * dims.dim * work.act_bytes / c.tp
        extra_once = full_layer_bytes
    elif c.recompute == "selective":
        layer_bytes, extra_once = full_layer_bytes / 2, 0.0
    else:
        layer_bytes, extra_once = full_layer_bytes, 0.0
    activations = layers_in_flight(dims.num_layers, c, rank) * layer_bytes + extra_once
    loss_and_head = 0.0  # what only the last stage holds
    if last:
        logits_in_flight = c.microbatches if (c.gpipe and c.pp_enabled) else 1
        logits = tokens * dims.vocab_size
        if work.chunked_loss and c.tp == 1 and c.pp == 1:
            # raytrain's own loss, a chunk of tokens at a time, each chunk's logits recomputed
            # in the backward: one chunk's logits at most (models.gpt.chunked_cross_entropy)
            logits = min(logits, LOSS_CHUNK_BYTES // 4)
        loss_and_head = logits * loss_bytes_per_logit(work, c, logits_in_flight)
        if work.loss_parallel:
            loss_and_head /= c.tp
        # Outside every block (no recomputation there): the final norm keeps its input, the
        # head its own (the norm's output), all-gathered whole when the norm is sequence
        # parallel, as a column-wise linear's input is.
        norm_share = 1 / c.tp if (c.tp_enabled and c.sequence_parallel) else 1.0
        loss_and_head += logits_in_flight * tokens * dims.dim * work.act_bytes * (norm_share + 1)
    # raytrain's fused AdamW updates in place: no temporaries after the backward pass.
    return state + activations + loss_and_head


def loss_bytes_per_logit(work: Workload, c: Layout, in_flight: int = 1) -> float:
    """Bytes per logit the last stage holds at the loss's peak, the start of a micro-batch's
    backward: the fp32 log-softmax of each micro-batch in flight (kept for its backward) and,
    for the one going backward, two more fp32 tensors of its size at once (the gradient of
    the log-softmax's output and of its input). The logits themselves (compute precision) and
    their fp32 copy are freed after the loss's forward, except that a pipeline stage keeps its
    outputs until their backward. tests/pure/test_planner.py measures the real loss on CPU."""
    kept = 4 + (work.act_bytes if c.pp_enabled else 0)
    return kept * in_flight + 8


def _fsdp_s(dims: ModelDims, work: Workload, c: Layout, shape: NodeShape, compute_mb: float,
            layers_here: int, held: float) -> tuple[float, float]:
    """FSDP's seconds not hidden behind compute: per micro-batch, and once per step."""
    gpu, overlap = shape.gpu, shape.gpu.overlaps_communication
    shard_link = _link_for_span(c.tp * c.dp_shard, shape)
    fsdp_mb = dp_step = 0.0
    groups = layers_here + 1  # one FSDP unit per block, one at the root
    # One collective per unit: the bytes of all of them, and each one's latency.
    gather = _collective_s(held * work.act_bytes, c.dp_shard, shard_link) + \
        _latency_s(shard_link, c.dp_shard) * (groups - 1)
    # Each unit's fixed cost (its hooks, collectives' set-up), once per microbatch.
    units = groups * gpu.fsdp_unit_overhead_s
    scatter = _collective_s(held * work.grad_reduce_bytes, c.dp_shard, shard_link) * \
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
    if c.pp_enabled:
        traffic = gather + scatter
        hidden = c.microbatches * compute_mb if overlap else 0.0
        dp_step += max(0.0, traffic - hidden) + (traffic / groups if overlap else 0.0)
        dp_step += held * (gather_copies + scatter_copies) / gpu.copy_bandwidth + units
    else:
        # Blocks are gathered for forward and again for backward; the root is not
        # resharded after forward (FSDP2 keeps it for the backward that follows); with
        # zero2 no unit is, so the backward gathers nothing again.
        regathered = 0.0 if c.zero2 else 1 - root_params(dims, c) / held
        # reduce_scatter_once: one reduce-scatter (and its copies) per step, on the last
        # micro-batch, and each micro-batch's gradients added into the unsharded ones.
        once = c.reduce_scatter_once
        per_mb = (1 + regathered) * gather + (0.0 if once else scatter)
        hidden = compute_mb if overlap else 0.0
        fsdp_mb = max(0.0, per_mb - hidden) + (per_mb / groups if overlap else 0.0)
        fsdp_mb += held * ((1 + regathered) * gather_copies + (4 if once else scatter_copies)) \
            / gpu.copy_bandwidth + units
        if once:
            dp_step += scatter + held * scatter_copies / gpu.copy_bandwidth
    return fsdp_mb, dp_step


def step_time(dims: ModelDims, work: Workload, c: Layout,
              shape: NodeShape) -> dict[str, float]:
    """Seconds per optimizer step, by part (compute, tp, pp, bubble, dp, optimizer, total)."""
    gpu = shape.gpu
    tokens = c.micro_batch_size * dims.seq_len
    layers_here = math.ceil(dims.num_layers / c.pp)
    compute_mb = slowest_rank_compute_s(dims, work, c, gpu)
    tp_passes = 12 if c.recompute == "full" else 8
    act_bytes_mb = tokens * dims.dim * work.act_bytes
    tp_link = _link_for_span(c.tp, shape)
    tp_mb = 0.0
    if c.tp_enabled:
        # Half the passes are all-gathers, half reduce-scatters.
        gather_bytes = act_bytes_mb if work.tp_gather_bytes is None else \
            tokens * dims.dim * work.tp_gather_bytes
        gather = _collective_s(gather_bytes, c.tp, tp_link)
        scatter = _collective_s(act_bytes_mb, c.tp, tp_link) * tp_link.reduce_scatter_factor
        regather = 2 if (c.sequence_parallel and work.sp_regather) else 0
        tp_mb = layers_here * ((tp_passes / 2 + regather) * gather + tp_passes / 2 * scatter)
        tp_mb += layers_here * gpu.tp_block_overhead_s
    pp_link = _link_for_span(c.world_size, shape) if c.pp_enabled else shape.intra
    pp_mb = 0.0
    if c.pp_enabled:
        message = act_bytes_mb / c.tp
        pp_mb = 2 * c.virtual_stages * (message / (pp_link.bandwidth * pp_link.efficiency)
                                         + pp_link.latency_s)
    held = stage_params(dims, c.pp, c.virtual_stages) / c.tp
    experts = dims.expert_params if c.ep_enabled else 0
    held -= experts  # expert parallelism's experts: never gathered by FSDP
    fsdp_mb, dp_step = (_fsdp_s(dims, work, c, shape, compute_mb, layers_here, held)
                        if c.data_parallel_wrapper == "fsdp" else (0.0, 0.0))
    ep_mb = 0.0
    if c.ep_enabled:
        # Per sparse block and micro-batch: dispatch and combine in the forward, their
        # gradients in the backward (and the forward's again when recomputed), on the
        # critical path; the experts' gradients summed over the expert groups once a step.
        ep_link = _link_for_span(c.ep, shape)
        transfers = 6 if c.recompute == "full" else 4
        message = dims.all_to_all_bytes(tokens, work.act_bytes, c.ep)
        ep_mb = dims.sparse_layers * transfers * (
            message / (ep_link.bandwidth * ep_link.efficiency) + _latency_s(ep_link, c.ep))
        groups = c.dp_shard // c.ep
        if groups > 1:
            dp_step += 2 * _collective_s(experts / c.ep * work.grad_reduce_bytes, groups,
                                         _link_for_span(c.dp_shard, shape))
    overlap = gpu.overlaps_communication
    if c.dp_replicate_enabled:
        replicate_link = _link_for_span(c.world_size // c.pp, shape)
        grads = held / c.dp_shard * work.grad_reduce_bytes
        allreduce = 2 * _collective_s(grads, c.dp_replicate, replicate_link)
        if c.data_parallel_wrapper == "ddp" and overlap:
            backward = compute_mb * 2 / 3
            dp_step += max(0.0, allreduce - backward) + allreduce / max(1, layers_here)
        else:
            # Once per optimizer step: FSDP2 holds the all-reduce across replicas back until
            # the last micro-batch (raytrain.parallel), as a pipeline does; not hidden.
            dp_step += allreduce
    per_mb = compute_mb + tp_mb + pp_mb + fsdp_mb + ep_mb
    slots = c.microbatches + ((c.pp - 1) / c.virtual_stages if c.pp_enabled else 0.0)
    optimizer = (held / c.dp_shard + experts / c.ep) * 28 / gpu.memory_bandwidth + \
        gpu.step_overhead_s
    total = per_mb * slots + dp_step + optimizer
    return {
        "compute": compute_mb * c.microbatches,
        "tensor_parallel": tp_mb * c.microbatches,
        "pipeline_p2p": pp_mb * c.microbatches,
        "bubble": per_mb * (slots - c.microbatches),
        "data_parallel": fsdp_mb * c.microbatches + dp_step,
        "expert_parallel": ep_mb * c.microbatches,
        "optimizer": optimizer,
        "total": total,
    }
