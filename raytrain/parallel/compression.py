"""Compression of data-parallel gradient traffic through DDP communication hooks.

fp16/bf16 casts and PowerSGD are torch's own hooks (`default_hooks`, `powerSGD_hook`). Top-k
sparsification with error feedback is not in torch, so it is written here: each rank sends
only the `ratio` largest-magnitude entries of (gradient + what it did not send before), the
ranks all-gather those (index, value) pairs and average them into a dense gradient, and the
entries left out are carried to the next step (Stich et al., 2018; Lin et al., 2018 "Deep
Gradient Compression"). Without the carried residual, small gradient components are never
sent at all and training lags.

    register_compression(ddp_model, "powersgd", group, powersgd_rank=2)
"""

# No `from __future__ import annotations`: DDP checks a hook's annotations as real objects.
import math
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel


@dataclass
class TopKState:
    group: dist.ProcessGroup
    ratio: float
    error_feedback: bool = True
    residuals: dict[int, torch.Tensor] = field(default_factory=dict)


def topk_hook(
    state: TopKState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradient over ranks, sending only its top-k entries."""
    grad = bucket.buffer()
    flat = grad.view(-1)
    residual = state.residuals.get(bucket.index())
    if state.error_feedback and residual is not None and residual.shape == flat.shape:
        flat = flat + residual
    k = max(1, math.ceil(state.ratio * flat.numel()))
    _, indices = torch.topk(flat.abs(), k, sorted=False)
    values = flat[indices]
    if state.error_feedback:
        left = flat.clone()
        left[indices] = 0
        state.residuals[bucket.index()] = left
    world = dist.get_world_size(state.group)
    gathered_indices = [torch.empty_like(indices) for _ in range(world)]
    gathered_values = [torch.empty_like(values) for _ in range(world)]
    dist.all_gather(gathered_indices, indices, group=state.group)
    dist.all_gather(gathered_values, values, group=state.group)
    dense = torch.zeros_like(flat)
    for rank_indices, rank_values in zip(gathered_indices, gathered_values):
        dense.index_add_(0, rank_indices, rank_values)
    dense.div_(world)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(dense.view_as(grad))
    return future


def bf16_hook(
    group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16 compression (cast, all-reduce, cast back). DDP refuses torch's own
    `bf16_compress_hook` unless the backend is NCCL or XCCL; this is the same function under
    another name, so gloo ranks can use it too."""
    return default_hooks._compress_hook(  # noqa: SLF001 - torch has no public one
        torch.bfloat16, group, bucket)


def register_compression(
    model: DistributedDataParallel,
    kind: str,
    group: dist.ProcessGroup,
    powersgd_rank: int = 2,
    topk_ratio: float = 0.01,
    topk_error_feedback: bool = True,
) -> object:
    """Install the hook for `kind` ('none', 'fp16', 'bf16', 'powersgd', 'topk') on `model`;
    the hook's state (PowerSGD's, top-k's residuals), the group for the casts, None for none."""
    if kind == "none":
        return None
    if kind == "fp16":
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        return group
    if kind == "bf16":
        model.register_comm_hook(group, bf16_hook)
        return group
    if kind == "powersgd":
        # Compression from the second step on (the first warms up with a plain all-reduce,
        # which error feedback and warm start need).
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=2,
            min_compression_rate=1.0,
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    if kind == "topk":
        topk = TopKState(group, topk_ratio, topk_error_feedback)
        model.register_comm_hook(topk, topk_hook)
        return topk
    raise ValueError(f"unknown compression {kind!r}")
