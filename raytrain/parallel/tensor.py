"""Tensor parallelism (and sequence parallelism) on the built-in GPT, as torchtitan applies it:
each block's attention and MLP column-wise then row-wise, the embeddings row-wise, the head
column-wise; with sequence parallelism the norms and the residual stream stay split along
the sequence between blocks (torch.distributed.tensor.parallel's styles).

    apply_tensor_parallel(model, mesh["tp"], sequence_parallel=True)
"""

from __future__ import annotations

from typing import Any

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from raytrain.models.gpt import GPT


def apply_tensor_parallel(model: GPT, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style tensor parallel on the GPT's linears; with sequence parallel, the norms
    and the residual stream between blocks are split along the sequence (dimension 1)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        if model.pos_embeddings is not None:
            # Positions: rows of the table, output [seq, dim] split like the tokens' output.
            top["pos_embeddings"] = RowwiseParallel(
                input_layouts=Replicate(),
                output_layouts=Shard(0) if sequence_parallel else Replicate())
    if model.output is not None:
        if sequence_parallel:
            top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        if block.attention.q_norm is not None:
            # Qwen3's q/k norms: each rank normalises its own heads (dimension 2 of [batch,
            # seq, heads, head_dim]) with the whole scale, kept as a replicated DTensor like
            # every other parameter of the block.
            for name in ("attention.q_norm", "attention.k_norm"):
                plan[name] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if sequence_parallel:
            plan.update({
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
            })
        parallelize_module(block, tp_mesh, plan)
    # Tied embeddings: both sharded alike (rows of the [vocab, dim] table); one parameter again.
    model.tie_weights()
