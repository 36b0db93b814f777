"""Build a job's model on this rank under its layout, and run one forward/backward over it.

Order of application, fixed (torchtitan's order, for the same reasons):
1. Pipeline split: this rank keeps only its stages' layers (plus the embeddings on the first
   stage, the final norm and head on the last). Built on the meta device, so no rank ever
   holds another stage's weights, or the whole model.
2. Tensor parallel (+ sequence parallel) on each stage: attention and MLP matmuls column-
   then row-wise, embeddings row-wise, the head column-wise; with sequence parallel the norms
   and residual stream stay split along the sequence between blocks.
3. Activation checkpointing per block, or of each attention core (selective), recomputed in
   the backward pass.
4. Data parallel: FSDP2 `fully_shard` per block and per stage (HSDP over a (replicate, shard)
   mesh when both degrees are set, and whenever data parallel meets tensor or pipeline
   parallel: see Layout.data_parallel_wrapper); otherwise DDP over the replicate group, with
   optional compression hooks.
5. Materialise (`to_empty`) and initialise each parameter from its name (GPT.init_weights), so
   every layout starts from the weights a single process would.

The mesh has four named dimensions, outermost first: ("pp", "dp_replicate", "dp_shard", "tp"),
so tensor-parallel peers are neighbouring ranks (on one node, over its fastest link) and
pipeline peers are farthest apart.

    model = build_parallel_model(spec, layout, torch.device("cpu"))
    loss = model.forward_backward([tokens_micro_0, tokens_micro_1])
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from raytrain.models.gpt import GPT
from raytrain.models.lora import apply_lora, freeze_in, init_lora
from raytrain.models.registry import build_model
from raytrain.parallel.blocks import transformer_blocks
from raytrain.parallel.compression import register_compression
from raytrain.parallel.experts import (
    apply_expert_parallel,
    expert_mesh,
    expert_params,
)
from raytrain.parallel.fsdp import apply_fsdp
from raytrain.parallel.model import ParallelModel, _one_rank_process_group
from raytrain.parallel.pipeline import Pipeline, gpt_stage
from raytrain.parallel.tensor import apply_tensor_parallel
from raytrain.spec import JobSpec
from raytrain.spec.layout import Layout, one_device_shards, stages_of_rank

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def _in_precision(model: nn.Module, precision: str, float8_gathers: bool = False
                  ) -> nn.Module:
    """The model with its linear layers in float8 under precision 'fp8' (as built, before
    any parallelism); unchanged otherwise. `float8_gathers`: FSDP gathers their weights in
    float8 (raytrain.parallel.float8)."""
    if precision != "fp8":
        return model
    from raytrain.parallel.float8 import to_float8

    return to_float8(model, fsdp_float8_all_gather=float8_gathers)


def build_mesh(layout: Layout, device: torch.device) -> DeviceMesh:
    shape = (layout.pp, layout.dp_replicate, layout.dp_shard, layout.tp)
    return init_device_mesh(device.type, shape, mesh_dim_names=MESH_DIMS)


def build_parallel_model(spec: JobSpec, layout: Layout, device: torch.device) -> ParallelModel:
    """This rank's model parts for `spec` under its resolved `layout`, initialised, on
    `device`."""
    parallel, training = spec.parallel, spec.training
    scaler = torch.amp.GradScaler(device.type) if training.precision == "fp16" else None
    compiled = training.compile if training.compile is not None else device.type == "cuda"
    # bf16 on one device: FSDP2 over a mesh of one, for its bf16 parameters (the residual
    # stream, norms and adds in bf16, no cache of cast weights beside the fp32 ones) with fp32
    # gradients and optimizer state, as on every FSDP layout; other precisions and LoRA keep
    # the plain module (fp32 needs no cast; fp16 and fp8 run under autocast; LoRA's frozen
    # weights are bf16 already).
    one_device_fsdp = one_device_shards(layout, training.precision,
                                        lora=training.lora is not None)
    if layout.world_size == 1 and not one_device_fsdp:
        model = _in_precision(build_model(spec.model, seed=training.seed), training.precision)
        if training.lora is not None:
            apply_lora(model, training.lora)
            init_lora(model, training.seed)
            if training.precision == "bf16":
                freeze_in(model, torch.bfloat16)
        model = model.to(device)
        _set_recompute(model, layout.recompute)
        if compiled:
            compile_blocks(model, spec.model.block_class)
        return ParallelModel(layout, device, [model], [model], precision=training.precision,
                             scaler=scaler, compiled=compiled,
                             balance_coef=balance_coef(spec),
                             bias_rate=bias_rate(spec))

    owns_group = one_device_fsdp and _one_rank_process_group(device)
    mesh = build_mesh(layout, device)
    pp_rank, rep_rank, shard_rank, tp_rank = mesh.get_coordinate()
    stage_ids = stages_of_rank(pp_rank, layout.pp, layout.num_stages)
    wrapper = "fsdp" if one_device_fsdp else layout.data_parallel_wrapper
    ep_mesh = expert_mesh(mesh, layout) if layout.ep_enabled else None
    parts: list[nn.Module] = []
    runners: list[nn.Module] = []
    units: list[str] = []
    # Float8 weights all-gathered as float8 under FSDP, as torchtitan does (half bf16's
    # bytes; FSDP2 gathers them as bytes, so gloo carries them too).
    float8_gathers = layout.data_parallel_wrapper == "fsdp"
    for stage in stage_ids:
        if spec.model.builtin:
            with torch.device("meta"):
                part = _in_precision(build_model(spec.model, seed=training.seed),
                                     training.precision, float8_gathers)
            if layout.pp_enabled:
                gpt_stage(part, stage, layout.num_stages)
            if training.lora is not None:  # before FSDP: its units hold the adapters too
                apply_lora(part, training.lora)
                if training.precision == "bf16":
                    freeze_in(part, torch.bfloat16)
            if layout.tp_enabled:
                apply_tensor_parallel(part, mesh["tp"], layout.sequence_parallel)
            if ep_mesh is not None:
                apply_expert_parallel(part, ep_mesh)
        else:  # a user model: data parallel only (the spec rejects anything else)
            part = _in_precision(build_model(spec.model, seed=training.seed),
                                 training.precision).to(device)
        _set_recompute(part, layout.recompute)
        if compiled:
            compile_blocks(part, spec.model.block_class)
        if wrapper == "fsdp":
            dp_mesh = (mesh["dp_replicate", "dp_shard"] if layout.dp_replicate_enabled
                       else mesh["dp_shard"])
            units.append(apply_fsdp(
                part, dp_mesh, reshard_after_forward=layout.pp == 1 and not layout.zero2,
                reduce_dtype=torch.bfloat16 if parallel.grad_reduce_dtype == "bf16" else None,
                block_class=spec.model.block_class,
                param_dtype=torch.bfloat16 if spec.training.precision == "bf16" else None,
                ignored=expert_params(part) if ep_mesh is not None else None))
        if isinstance(part, GPT) and _on_meta(part):
            part.to_empty(device=device)
            part.init_weights()
            if training.lora is not None:
                init_lora(part, training.seed)
        runner: nn.Module = part
        if wrapper == "ddp":
            runner = DistributedDataParallel(
                part,
                process_group=mesh["dp_replicate"].get_group(),
                device_ids=[device.index] if device.type == "cuda" else None,
            )
            register_compression(
                runner, parallel.ddp_compression, mesh["dp_replicate"].get_group(),
                powersgd_rank=parallel.powersgd_rank, topk_ratio=parallel.topk_ratio,
                topk_error_feedback=parallel.topk_error_feedback,
            )
        parts.append(part)
        runners.append(runner)

    model = ParallelModel(
        layout, device, parts, runners, mesh=mesh, stage_ids=stage_ids,
        dp_rank=rep_rank * layout.dp_shard + shard_rank,
        owns_loss=(pp_rank == layout.pp - 1 and tp_rank == 0),
        precision=training.precision, scaler=scaler,
        fsdp_units="; ".join(units) if units else None, compiled=compiled,
        owns_process_group=owns_group, balance_coef=balance_coef(spec), ep_mesh=ep_mesh,
        bias_rate=bias_rate(spec),
    )
    if layout.pp_enabled:
        model.pipeline = Pipeline(runners, stage_ids, layout, device, mesh["pp"].get_group(),
                                  model.stage_loss)
    return model


def bias_rate(spec: JobSpec) -> float:
    """DeepSeek-V3's bias update a step: training.moe.bias_update_rate, else DeepSeek-V3's
    own (0.001, the paper's gamma); 0 without a score correction bias."""
    moe = spec.model.gpt.moe if spec.model.builtin else None
    if moe is None or not moe.score_bias:
        return 0.0
    asked = spec.training.moe.bias_update_rate if spec.training.moe is not None else None
    return DEEPSEEK_V3_BIAS_RATE if asked is None else asked


DEEPSEEK_V3_BIAS_RATE = 0.001


def balance_coef(spec: JobSpec) -> float:
    """The load-balancing loss's weight: training.moe.aux_loss_coef, else the model's (its
    config's router_aux_loss_coef); 0 for a dense model."""
    moe = spec.model.gpt.moe if spec.model.builtin else None
    if moe is None:
        return 0.0
    asked = spec.training.moe.aux_loss_coef if spec.training.moe is not None else None
    return moe.aux_loss_coef if asked is None else asked


def _on_meta(module: nn.Module) -> bool:
    return any(p.device.type == "meta" for p in module.parameters())


def compile_blocks(model: nn.Module, block_class: str | None = None) -> None:
    """torch.compile each transformer block in place (`Module.compile`: the block keeps its
    class and state-dict names, so checkpoints and FSDP see the same module), as torchtitan
    does: one graph per block, reused by every block of the same shape, rather than one graph
    of the whole model (longer to compile, broken by pipeline stages and FSDP's hooks)."""
    layers = getattr(model, "layers", None)
    blocks = list(layers.values()) if isinstance(model, GPT) and layers is not None \
        else transformer_blocks(model, block_class)
    for block in blocks:
        block.compile()


def _set_recompute(model: nn.Module, mode: str) -> None:
    """'full': each block recomputed from its input; 'selective': each attention core."""
    for module in model.modules():
        if hasattr(module, "recompute"):
            module.recompute = mode == "full"
        if hasattr(module, "selective"):
            module.selective = mode == "selective"
