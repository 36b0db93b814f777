"""FSDP2 over the data ranks: `fully_shard` per transformer block (one all-gather each), then the
rest at the root, with the job's mixed precision.

    units = apply_fsdp(model, mesh["dp_shard"], reshard_after_forward=True)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from raytrain.models.gpt import GPT
from raytrain.parallel.blocks import describe_units, transformer_blocks


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, reshard_after_forward: bool,
               reduce_dtype: torch.dtype | None = None, block_class: str | None = None,
               param_dtype: torch.dtype | None = None,
               ignored: set[nn.Parameter] | None = None) -> str:
    """FSDP2 per transformer block (one all-gather each), then the rest at the root;
    `param_dtype`: the dtype parameters are gathered and computed in (bf16 for a bf16 job:
    half the bytes gathered, and the residual stream in bf16, as the planner prices it; the
    optimizer keeps its fp32 shards), `reduce_dtype`: the gradients' dtype in the
    reduce-scatter (None: fp32 with bf16 parameters, else the parameters'). The
    blocks: the built-in GPT's `layers` (a pipeline stage's share of them), or a user
    model's repeated blocks (raytrain.parallel.blocks, `block_class` from model.block_class).
    Returns what was made, in words, for the job's status. `ignored`: parameters FSDP leaves
    alone (expert parallelism's experts, raytrain.parallel.experts).

    The root (embeddings, final norm, head) is never resharded after forward: the backward
    starts with the head at once. That is FSDP2's own default for the root, but only when no
    `reshard_after_forward` is given; given True, torch 2.13 reshards the root too and
    gathers it again for the backward (measured: tests/ranks/test_parallel.py's gathered
    bytes)."""
    policy = MixedPrecisionPolicy(
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype or (torch.float32 if param_dtype is not None else None))
    layers = getattr(model, "layers", None)
    blocks = list(layers.values()) if isinstance(model, GPT) and layers is not None \
        else transformer_blocks(model, block_class)
    units = describe_units(model, blocks)  # before fully_shard renames the classes
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard_after_forward,
                    mp_policy=policy, ignored_params=ignored)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False, mp_policy=policy,
                ignored_params=ignored)
    return units
