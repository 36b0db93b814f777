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

import threading
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from raytrain.data.masks import IGNORE, inputs_and_targets
from raytrain.models.contract import logits_of
from raytrain.models.gpt import GPT
from raytrain.models.lora import apply_lora, freeze_in, init_lora
from raytrain.models.moe import balancing
from raytrain.models.registry import build_model
from raytrain.parallel.blocks import describe_units, transformer_blocks
from raytrain.parallel.compression import register_compression
from raytrain.parallel.experts import (
    apply_expert_parallel,
    expert_mesh,
    expert_params,
    sync_expert_grads,
)
from raytrain.parallel.pipeline import Pipeline
from raytrain.spec import JobSpec
from raytrain.spec.layout import Layout, one_device_shards, stage_layers, stages_of_rank

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def gpt_stage(model: GPT, stage: int, num_stages: int) -> GPT:
    """Cut `model` (usually on the meta device) down to stage `stage` of `num_stages`, in place.

    Layer names stay those of the whole model, so checkpoints line up across layouts."""
    keep = {str(i) for i in stage_layers(model.config.num_layers, num_stages)[stage]}
    for name in list(model.layers.keys()):
        if name not in keep:
            del model.layers[name]
    if stage > 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if stage < num_stages - 1:
        model.norm = None
        model.output = None
    return model


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


def _cross_entropy(output: Any, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """The mean (or summed) next-token loss of a forward's output (the built-in GPT's logits,
    or what a user's model returns: raytrain.models.contract) against `targets` (IGNORE
    where not trained), in fp32."""
    logits = output if isinstance(output, torch.Tensor) and output.dim() == 3 \
        else logits_of(output)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(),
                           ignore_index=IGNORE, reduction=reduction)


@dataclass
class ParallelModel:
    """This rank's share of the model, and how to push a step's micro-batches through it."""

    layout: Layout
    device: torch.device
    parts: list[nn.Module]  # checkpointed modules (state-dict names of the whole model)
    runners: list[nn.Module]  # what forward runs (DDP-wrapped where DDP applies)
    mesh: DeviceMesh | None = None
    pipeline: Pipeline | None = None  # pp > 1: the schedule for each micro-batch count
    stage_ids: list[int] = field(default_factory=lambda: [0])
    dp_rank: int = 0
    owns_loss: bool = True  # this rank's loss counts in the job's loss (last stage, tp rank 0)
    precision: str = "fp32"
    scaler: torch.amp.GradScaler | None = None
    fsdp_units: str | None = None  # what FSDP shards one by one, in words (None: no FSDP)
    compiled: bool = False  # each block under torch.compile (compile_blocks)
    # Masked data (raytrain.data.masks): each micro-batch's loss is its trained targets'
    # summed loss times this (the step's micro-batch count over its trained targets), so
    # that the step's loss is the mean over its trained targets however it is cut. None:
    # every target trained, each micro-batch's mean.
    loss_scale: float | None = None
    owns_process_group: bool = False  # holds the mesh of one's group: close() gives it back
    # A mixture of experts: the load-balancing loss's weight in the objective, and the last
    # step's balancing loss (mean over its micro-batches) and expert imbalance (the busiest
    # expert's tokens over the mean, at the worst block and micro-batch); None: dense.
    balance_coef: float = 0.0
    balance: tuple[torch.Tensor, torch.Tensor] | None = None
    ep_mesh: DeviceMesh | None = None  # expert parallelism's ("edp", "ep") mesh, if ep > 1

    def close(self) -> None:
        """End what building the model started in this process (a one-device bf16 model's
        process group), so that the process can train another job or start a group of its
        own."""
        if self.owns_process_group:
            self.owns_process_group = False
            _release_one_rank_process_group()

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        return self.mesh["pp"].get_group() if self.mesh is not None and self.layout.pp > 1 else None

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters() if p.requires_grad]

    def _autocast(self):
        if self.precision == "fp32":
            return nullcontext()
        dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16  # fp8: bf16 too
        return torch.autocast(self.device.type, dtype=dtype)

    def forward_backward(self, micro_batches: list[torch.Tensor]) -> torch.Tensor:
        """Gradients of the mean loss over `micro_batches` (each [micro, seq + 1] tokens);
        returns this rank's share of that loss (0 on ranks that do not own it)."""
        if self.pipeline is not None:
            return self._pipeline_step(micro_batches)
        runner = self.runners[0]
        total = torch.zeros((), device=self.device)
        count = len(micro_batches)
        for index, tokens in enumerate(micro_batches):
            tokens = tokens.to(self.device)
            last = index == count - 1
            # Gradients cross replicas once per optimizer step, on the last micro-batch: DDP
            # through no_sync, FSDP2 (HSDP, and data parallel beside tensor parallel) by
            # holding its all-reduce back. Its reduce-scatter within a replica runs every
            # micro-batch, so no rank holds unsharded gradients between them, unless the
            # layout holds it back too (reduce_scatter_once: a planner decision by memory).
            if isinstance(runner, FSDPModule) and self.layout.reduce_scatter_once:
                runner.set_requires_gradient_sync(last, recurse=True)
            elif isinstance(runner, FSDPModule) and self.layout.dp_replicate > 1:
                runner.set_requires_all_reduce(last, recurse=True)
            sync = runner.no_sync() if (not last and isinstance(runner, DistributedDataParallel)) \
                else nullcontext()
            with sync:
                with self._autocast():
                    loss = self._loss(runner, tokens) / count
                    objective = self._balanced(loss, count, first=index == 0)
                (self.scaler.scale(objective) if self.scaler is not None
                 else objective).backward()
            total += loss.detach()
        if self.ep_mesh is not None:
            for part in self.parts:
                sync_expert_grads(part, self.ep_mesh, self.layout.dp_shard)
        return total if self.owns_loss else torch.zeros((), device=self.device)

    def _balanced(self, loss: torch.Tensor, count: int, first: bool) -> torch.Tensor:
        """The micro-batch's objective: its loss, plus the experts' load-balancing loss of
        its forward times balance_coef (raytrain.models.moe.balancing); kept apart in
        `balance`, so the reported loss stays the language model's."""
        part = self.parts[0]
        found = balancing(part.experts()) if isinstance(part, GPT) else None
        if found is None:
            return loss
        aux, imbalance = found
        if first or self.balance is None:
            self.balance = (aux.detach() / count, imbalance)
        else:
            self.balance = (self.balance[0] + aux.detach() / count,
                            torch.maximum(self.balance[1], imbalance))
        return loss + self.balance_coef * aux / count if self.balance_coef else loss

    def _loss(self, runner: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        """The mean next-token loss of one micro-batch. The built-in model computes it a
        chunk of tokens at a time, its logits never whole (models.gpt.chunked_cross_entropy;
        not under tensor parallelism, whose head is sharded by vocabulary)."""
        inputs, targets = (tokens[:, :-1], tokens[:, 1:]) if self.loss_scale is None \
            else inputs_and_targets(tokens)
        if isinstance(self.parts[0], GPT) and self.layout.tp == 1:
            loss: torch.Tensor = runner(inputs, targets=targets)
            return loss if self.loss_scale is None else \
                loss * (targets.numel() * self.loss_scale)
        output = runner(inputs)
        if not (isinstance(output, torch.Tensor) and output.dim() == 3):
            # a user's model: what it may return (raytrain.models.contract)
            output = logits_of(output, self.parts[0])
        return self.stage_loss(output, targets)

    def stage_loss(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss from the model's output (a pipeline's last stage's too)."""
        if self.loss_scale is None:
            return _cross_entropy(output, targets)
        return _cross_entropy(output, targets, reduction="sum") * self.loss_scale

    @torch.no_grad()
    def evaluate(self, micro_batches: list[torch.Tensor]) -> torch.Tensor:
        """The mean loss over `micro_batches`, forward only; this rank's share of it (0 on
        ranks that do not own it), as forward_backward returns. Under a pipeline, the
        schedule's forward-only pass (`eval`) over the same micro-batches."""
        if self.pipeline is not None:
            return self._pipeline_step(micro_batches, forward_only=True)
        runner = self.runners[0]
        total = torch.zeros((), device=self.device)
        for tokens in micro_batches:
            tokens = tokens.to(self.device)
            with self._autocast():
                total += self._loss(runner, tokens) / len(micro_batches)
        return total if self.owns_loss else torch.zeros((), device=self.device)

    def _pipeline_step(self, micro_batches: list[torch.Tensor], forward_only: bool = False
                       ) -> torch.Tensor:
        tokens = torch.cat(micro_batches).to(self.device)
        first, last = 0 in self.stage_ids, self.layout.num_stages - 1 in self.stage_ids
        losses: list[torch.Tensor] = []
        inputs, targets = (tokens[:, :-1], tokens[:, 1:]) if self.loss_scale is None \
            else inputs_and_targets(tokens)
        args = (inputs,) if first else ()
        assert self.pipeline is not None
        schedule = self.pipeline(len(micro_batches))
        with self._autocast():
            (schedule.eval if forward_only else schedule.step)(
                *args,
                target=targets if last else None,
                losses=losses if last else None,
                return_outputs=False,
            )
        if last and self.owns_loss:
            # The schedule scales gradients by 1 / microbatches: the step's loss is the mean.
            return torch.stack([loss.detach() for loss in losses]).mean()
        return torch.zeros((), device=self.device)


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
                             balance_coef=balance_coef(spec))

    owns_group = one_device_fsdp and _one_rank_process_group(device)
    mesh = build_mesh(layout, device)
    pp_rank, rep_rank, shard_rank, tp_rank = mesh.get_coordinate()
    stage_ids = stages_of_rank(pp_rank, layout.pp, layout.num_stages)
    wrapper = "fsdp" if one_device_fsdp else layout.data_parallel_wrapper
    ep_mesh = expert_mesh(mesh, layout) if layout.ep > 1 else None
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
            if layout.pp > 1:
                gpt_stage(part, stage, layout.num_stages)
            if training.lora is not None:  # before FSDP: its units hold the adapters too
                apply_lora(part, training.lora)
                if training.precision == "bf16":
                    freeze_in(part, torch.bfloat16)
            if layout.tp > 1:
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
            dp_mesh = (mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1
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
    )
    if layout.pp > 1:
        model.pipeline = Pipeline(runners, stage_ids, layout, device, mesh["pp"].get_group(),
                                  model.stage_loss)
    return model


def balance_coef(spec: JobSpec) -> float:
    """The load-balancing loss's weight: training.moe.aux_loss_coef, else the model's (its
    config's router_aux_loss_coef); 0 for a dense model."""
    moe = spec.model.gpt.moe if spec.model.builtin else None
    if moe is None:
        return 0.0
    asked = spec.training.moe.aux_loss_coef if spec.training.moe is not None else None
    return moe.aux_loss_coef if asked is None else asked


def _one_rank_process_group(device: torch.device) -> bool:
    """A process group of this process alone, for FSDP2's mesh of one, unless one exists
    that this function did not make (Ray Train's worker has one already); its store is in
    memory: nothing is listened on. Counted, so that models built side by side in one
    process (threads) share it and the last one's close() ends it. Whether this model
    holds a count (ParallelModel.close gives it back)."""
    with _ONE_RANK_LOCK:
        if dist.is_initialized() and _ONE_RANK_USERS[0] == 0:
            return False
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                    store=dist.HashStore(), rank=0, world_size=1)
        _ONE_RANK_USERS[0] += 1
        return True


def _release_one_rank_process_group() -> None:
    with _ONE_RANK_LOCK:
        _ONE_RANK_USERS[0] -= 1
        if _ONE_RANK_USERS[0] == 0 and dist.is_initialized():
            dist.destroy_process_group()


_ONE_RANK_LOCK = threading.Lock()
_ONE_RANK_USERS = [0]  # models holding the process group _one_rank_process_group made


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


def clip_grad_norm(model: ParallelModel, max_norm: float | None) -> torch.Tensor:
    """Clip the gradient norm of the whole model, wherever its pieces live; return the norm.

    torch's clip_grad_norm_ sees one rank's parameters: it is right for DDP and for DTensors
    (tensor parallel, FSDP2), whose norms it reduces over their mesh, but not across pipeline
    stages, each holding different layers. So: the norm of local plain tensors and of each
    mesh's DTensors, squared and summed, then summed over the pipeline ranks. Returns the
    norm as a tensor on the device.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    squared = torch.zeros((), device=model.device, dtype=torch.float32)
    plain = [g for g in grads if not isinstance(g, DTensor)]
    if plain:
        squared += torch.nn.utils.get_total_norm(plain).float() ** 2
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for grad in grads:
        if isinstance(grad, DTensor):
            by_mesh.setdefault((grad.device_mesh, tuple(grad.placements)), []).append(grad)
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group)
        squared += (norm.full_tensor() if isinstance(norm, DTensor) else norm).float() ** 2
    if model.pp_group is not None:
        dist.all_reduce(squared, group=model.pp_group)
    total = squared.sqrt()
    if max_norm is not None:
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        with torch.no_grad():
            for grad in grads:  # plain tensors and shards alike: scale what this rank holds
                (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(coef)
    return total  # a tensor: reading it would wait for the device every step
