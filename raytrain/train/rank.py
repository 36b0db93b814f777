"""What one rank of a job is made of, before and around its steps: who it is, its share of
the model and its optimizers, the data, resuming, saving, and one step's math (micro-batches
forward and backward, the update at the step's learning rate). raytrain.train.loop runs the
steps; nothing here knows whether the rank trains alone, in one group, or in one of several
replica groups.

    model, optimizers, source, plan = build_rank(spec, layout, WorkerInfo.single_process())
    loss = forward_backward(model, Prefetcher(source, plan, 0, cpu).get(0, [0, 1]), share=1.0)
    lr, grad_norm = optimizer_step(model, optimizers, spec, step=0)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from raytrain.core.batching import BatchPlan
from raytrain.core.schedule import lr_multiplier, peak_learning_rate
from raytrain.data.prefetch import loss_scale, trained_targets
from raytrain.data.sources import TokenSource, build_source
from raytrain.models.hf import export_adapter, export_folder, load_pretrained
from raytrain.parallel.model import ParallelModel, clip_grad_norm
from raytrain.parallel.parallelize import build_parallel_model
from raytrain.spec import JobSpec
from raytrain.spec.layout import Layout
from raytrain.train.checkpoint import CheckpointManager
from raytrain.train.progress import ProgressMeter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    world_size: int
    device: torch.device

    @staticmethod
    def single_process() -> WorkerInfo:
        return WorkerInfo(rank=0, world_size=1, device=torch.device("cpu"))

    @staticmethod
    def from_process_group(device: torch.device) -> WorkerInfo:
        return WorkerInfo(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


class Notices(Protocol):
    """What a worker hears about its node's fate (raytrain.cloud.interruption.Watcher)."""

    @property
    def stop_requested(self) -> bool: ...  # the node is being taken: checkpoint and stop

    def take_checkpoint_request(self) -> bool: ...  # it may be: checkpoint now, once

    @property
    def noticed_at(self) -> float | None: ...  # unix time the interruption notice came


class NoNotices:
    stop_requested = False
    noticed_at = None

    def take_checkpoint_request(self) -> bool:
        return False


def build_optimizer(model: nn.Module, spec: JobSpec) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and none on norms and biases.

    The fused kernel (CPU and CUDA, DTensor included) updates each parameter in one pass over
    its parameter, gradient and two moments; the default multi-tensor kernel makes several
    passes and holds an fp32 temporary the size of the parameters. On the demo's model on one
    CPU thread the step takes 0.4 ms against 1.3 ms (about 2% of a training step).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": spec.training.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    # A group with no parameters (LoRA's adapters are all matrices) is left out: torch's
    # set_state_dict reads each saved group's first parameter, and a group healed or resumed
    # with none failed (IndexError) where it loaded.
    groups = [group for group in groups if group["params"]]
    return torch.optim.AdamW(
        groups, lr=spec.training.learning_rate, betas=spec.training.betas, fused=True
    )


def build_rank(spec: JobSpec, layout: Layout, worker: WorkerInfo
               ) -> tuple[ParallelModel, list[torch.optim.Optimizer], TokenSource, BatchPlan]:
    """This rank's part of the model, its optimizers, the data and the batch plan."""
    if layout.world_size != worker.world_size:
        raise ValueError(
            f"the job's layout ({layout.describe()}) needs {layout.world_size} ranks, but "
            f"{worker.world_size} were started"
        )
    training = spec.training
    torch.manual_seed(training.seed)
    model = build_parallel_model(spec, layout, worker.device)
    optimizers: list[torch.optim.Optimizer] = [build_optimizer(part, spec)
                                               for part in model.parts]
    vocab = spec.model.gpt.vocab_size if spec.model.builtin else None
    source = build_source(spec.data, vocab)
    return model, optimizers, source, BatchPlan(training.global_batch_size,
                                                training.micro_batch_size, layout.dp)


def start_meter(spec: JobSpec, model: ParallelModel, start_step: int,
                first_loss: float | None, interval_s: float) -> ProgressMeter:
    """The progress meter of a run going on from `start_step`; its reports say what FSDP
    shards (progress.fsdp_units)."""
    meter = ProgressMeter(spec.training.steps, spec.tokens_per_step, start_step, time.monotonic,
                          interval_s=interval_s, first_loss=first_loss)
    if model.fsdp_units is not None:
        meter.fixed["fsdp_units"] = model.fsdp_units
    unread = spec.model.gpt.unread_layers if spec.model.builtin else 0
    if unread:
        meter.fixed["left_out"] = (f"the checkpoint's {unread} multi-token prediction "
                                   f"layer(s) past block {spec.model.gpt.num_layers - 1}: "
                                   "not read, not trained")
    return meter


def resume_rank(checkpoints: CheckpointManager, spec: JobSpec, model: ParallelModel,
                optimizers: list[torch.optim.Optimizer], worker: WorkerInfo
                ) -> tuple[int, float | None, float]:
    """Load the job's latest checkpoint (or, for a resumed job before its own first, the one
    it resumes from): the step to go on from, the first loss, and the last loss (the result,
    if nothing is left to run)."""
    latest = checkpoints.latest()
    if latest is None and spec.training.resume_from:
        latest = spec.training.resume_from
    if latest is None:
        source = spec.model.hf
        if source is not None and source.weights == "pretrained":
            fetched = load_pretrained(model.parts, source.path, spec.model.gpt.tie_embeddings)
            if worker.rank == 0:
                logger.info("loaded the pretrained weights of %s%s", source.path,
                            f" ({fetched:,} bytes fetched by rank 0)" if fetched else "")
        return 0, None, float("nan")
    meta = checkpoints.load(latest, model.parts, optimizers)
    if worker.rank == 0:
        logger.info("resumed from %s at step %d", latest, meta["step"])
    return meta["step"], meta.get("first_loss"), meta.get("loss", float("nan"))


def save_step(checkpoints: CheckpointManager, steps_done: int, model: ParallelModel,
              optimizers: list[torch.optim.Optimizer], meta: dict[str, Any],
              meter: ProgressMeter, wait: bool) -> bool:
    """Checkpoint this step; True if a save was made (a periodic one is skipped while the
    last is still being stored)."""
    save_s = checkpoints.save(steps_done, model.parts, optimizers, meta, wait=wait)
    if save_s is not None:
        meter.saved(save_s)
    return save_s is not None


def export_at_end(spec: JobSpec, model: ParallelModel, checkpoint_root: Path | str,
                  worker: WorkerInfo) -> None:
    """A kind 'hf' job that trained its last step writes its weights as a Hugging Face
    folder, `hf/` beside its checkpoints (every rank of the group takes part)."""
    source = spec.model.hf
    if source is None:
        return
    if str(checkpoint_root).startswith("s3://"):
        if worker.rank == 0:
            logger.warning("the Hugging Face folder is written beside checkpoints on a local "
                           "or mounted path only; this job's are in a bucket")
        return
    if spec.training.lora is not None:  # the adapter, as PEFT loads it onto the source
        out = export_adapter(model.parts, spec.training.lora, source.path,
                             Path(checkpoint_root) / "hf")
    else:
        out = export_folder(model.parts, source.path, Path(checkpoint_root) / "hf",
                            spec.model.gpt.tie_embeddings)
    if worker.rank == 0:
        logger.info("wrote the model as a Hugging Face folder: %s", out)


def validation_loss(model: ParallelModel, held_out: TokenSource, plan: BatchPlan,
                    batches: int, worker: WorkerInfo, dp: int) -> float:
    """The mean loss over `batches` global batches of the validation source (each cut
    across the group's data-parallel ranks as a training step's is), forward only: the same
    on every layout (masked data: each batch's mean over its trained targets). Every rank of
    the group takes part."""
    total = torch.zeros((), device=worker.device)
    for index in range(batches):
        micro = [held_out.batch(plan.sample_range(index, unit, model.dp_rank))
                 for unit in range(plan.grad_accum_steps)]
        trained = trained_targets(held_out, plan.step_samples(index))
        model.loss_scale = loss_scale(plan, trained)
        total += model.evaluate(micro)
    model.loss_scale = None
    total = total.to(torch.float64) / batches
    if worker.world_size > 1:
        dist.all_reduce(total)
    return float(total) / dp


def forward_backward(model: ParallelModel, batches: list[torch.Tensor], share: float
                     ) -> torch.Tensor:
    """Gradients of the mean loss over this rank's micro-batches of a step (all of them,
    unless replica groups share the step), scaled by `share` (the part of the step's
    micro-batches they are); this rank's loss share, scaled alike, on the device. Gradients
    are cleared first: a step that is not committed is done again."""
    for part in model.parts:
        part.zero_grad(set_to_none=True)
    if not batches:  # a group with no share of this step (more groups than units)
        return torch.zeros((), dtype=torch.float64)
    loss = model.forward_backward(batches)
    if share != 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(share)
        loss = loss * share
    return loss.detach()


def optimizer_step(model: ParallelModel, optimizers: list[torch.optim.Optimizer],
                   spec: JobSpec, step: int) -> tuple[float, torch.Tensor]:
    """The update of step `step` (counting from 0): its learning rate, and the gradient norm
    before clipping, across every shard and stage (a tensor on the device, read in a batch
    later). With fp16, gradients are unscaled first and a step with an overflow skipped."""
    lr = step_learning_rate(step, spec)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
    scaler = model.scaler
    if scaler is not None:
        for optimizer in optimizers:
            scaler.unscale_(optimizer)
    grad_norm = clip_grad_norm(model, spec.training.grad_clip_norm)  # None: measured only
    for optimizer in optimizers:
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
    if scaler is not None:
        scaler.update()
    model.update_expert_bias()
    return lr, grad_norm


def step_learning_rate(step: int, spec: JobSpec) -> float:
    """The learning rate of step `step`'s update (counting from 0): the peak times the
    schedule's multiplier (raytrain.core.schedule; docs/reference/step.md, "What a step does")."""
    training = spec.training
    return peak_learning_rate(training) * lr_multiplier(step, training.warmup, training.steps,
                                                        training.min_lr_ratio)
