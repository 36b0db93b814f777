"""This rank's share of a job's model once built (raytrain.parallel.parallelize builds it): the
parts it holds, how a step's micro-batches go through them (gradient accumulation, the
replicas' all-reduce held to the last micro-batch, a mixture of experts' balancing loss,
expert parallelism's gradient sums, a pipeline's schedule), validation's forward, and the
gradient norm over every piece wherever it lives.

    loss = model.forward_backward([tokens_micro_0, tokens_micro_1])
    norm = clip_grad_norm(model, 1.0)
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
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from raytrain.data.masks import IGNORE, inputs_and_targets
from raytrain.models.contract import logits_of
from raytrain.models.gpt import GPT
from raytrain.models.moe import balancing
from raytrain.parallel.experts import (
    sync_expert_grads,
)
from raytrain.parallel.pipeline import Pipeline
from raytrain.spec.layout import Layout


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
    bias_rate: float = 0.0  # DeepSeek-V3's bias update a step (training.moe.bias_update_rate)

    def close(self) -> None:
        """End what building the model started in this process (a one-device bf16 model's
        process group), so that the process can train another job or start a group of its
        own."""
        if self.owns_process_group:
            self.owns_process_group = False
            _release_one_rank_process_group()

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        if self.mesh is None or not self.layout.pp_enabled:
            return None
        return self.mesh["pp"].get_group()

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
            elif isinstance(runner, FSDPModule) and self.layout.dp_replicate_enabled:
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

    def update_expert_bias(self) -> None:
        """After an optimizer step: each mixture of experts' score correction bias moved
        towards balance by the tokens every rank routed to each expert since the last step
        (summed over this job's ranks; MoE.update_bias)."""
        if not self.bias_rate:
            return
        for part in self.parts:
            for moe in part.experts() if isinstance(part, GPT) else []:
                if moe.moe.score_bias:
                    routed = moe.routed_since.clone()
                    if dist.is_initialized() and dist.get_world_size() > 1:
                        dist.all_reduce(routed)
                    moe.update_bias(self.bias_rate, routed)

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
