"""The per-worker training loop: load, step, save. Knows nothing of Ray.

The same function runs inside Ray Train workers (raytrain.train.launcher), under torchrun in
benchmarks, and in one plain process in tests; the caller passes who this worker is, where
checkpoints live and where progress goes. The process group, if any, is already set up.

    result = train(spec, WorkerInfo.single_process(), NullSink(), Path("/tmp/ckpt"),
                   layout=job_layout(spec))

Order of work: build this rank's share of the model under the job's parallel layout
(raytrain.parallel.parallelize: pipeline stages, tensor parallel, FSDP2 or DDP), one AdamW per
model part (decay on matrices only), resume from the latest checkpoint if there is one, then
for each optimizer step push the step's micro-batches through (gradient accumulation, or the
pipeline's microbatches), clip the gradient norm across every shard and stage, step, publish
progress from rank 0, and checkpoint every `checkpoint_every_steps`, whenever the service's
interval for the job's capacity has passed (the policy's, for its preemption risk: rank 0's
sink says it, and the request rides in the loss all-reduce so every rank saves at the same
step), and at the end.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from raytrain.core.batching import BatchPlan
from raytrain.core.schedule import lr_multiplier, peak_learning_rate
from raytrain.core.step_rules import StepRule, after_step
from raytrain.data.sources import TokenSource, build_source
from raytrain.parallel.parallelize import ParallelModel, build_parallel_model, clip_grad_norm
from raytrain.spec import JobSpec
from raytrain.spec.layout import Layout
from raytrain.train.checkpoint import CheckpointManager
from raytrain.train.progress import ProgressMeter, ProgressSink

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
    return torch.optim.AdamW(
        groups, lr=spec.training.learning_rate, betas=spec.training.betas, fused=True
    )


def _vocab_size(spec: JobSpec) -> int | None:
    return spec.model.gpt.vocab_size if spec.model.kind == "gpt" else None


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


@dataclass(frozen=True)
class Synced:
    losses: tuple[float, ...]  # each step's since the last sync, the latest last
    stop: bool  # the service asked the job to stop
    checkpoint: bool  # some rank's node may be taken: checkpoint now
    preempt: bool  # some rank's node is being taken: checkpoint and stop

    @property
    def loss(self) -> float:
        return self.losses[-1]


class LossSync:
    """When ranks agree on the loss and on stopping: one small all-reduce every few steps.

    Rank 0 alone hears from the service; its stop flag rides in the same all-reduce as the
    loss, so all ranks leave the loop at the same step. So do each rank's interruption
    notices: any rank's notice makes every rank checkpoint (and stop) at the same step.
    Reducing every step would add a barrier per step (about 4% of a small model's throughput
    on 2 CPU ranks, measured with benchmarks/loop_overhead.py), so the reduction happens
    about every `target_s` seconds of training instead. The interval is rank 0's choice from
    its measured step time, and it travels in the same all-reduce, so every rank knows the
    next sync step without another message. `target_s=0` syncs every step.
    """

    MAX_INTERVAL = 1000

    def __init__(
        self, world_size: int, rank: int, target_s: float, dp: int = 0, clock=time.monotonic
    ) -> None:
        self.world_size = world_size
        self.dp = dp or world_size  # ranks whose loss shares add up to the job's loss
        self.rank = rank
        self.target_s = target_s
        self.clock = clock
        self.interval = 1
        self._since = 0
        self._window_started = clock()

    def due(self, forced: bool) -> bool:
        """Call once per step, after it; True when this step's loss must be reduced."""
        self._since += 1
        return forced or self._since >= self.interval

    def reduce(self, loss_sum: torch.Tensor, stop_here: bool, checkpoint_here: bool = False,
               preempt_here: bool = False) -> Synced:
        """Mean loss over data-parallel ranks (others pass 0) of each step since the last
        sync (`loss_sum`: one value a step, the latest last) and whether any rank was asked to
        stop, to checkpoint, or to checkpoint and stop; sets the next interval."""
        now = self.clock()
        next_interval = 0.0
        if self.rank == 0:
            step_s = (now - self._window_started) / max(1, self._since)
            wanted = self.target_s / step_s if step_s > 0 else self.MAX_INTERVAL
            next_interval = float(min(self.MAX_INTERVAL, max(1, int(wanted))))
        flags = [float(stop_here), float(checkpoint_here), float(preempt_here), next_interval]
        losses = loss_sum.to(torch.float64).reshape(-1)
        values = torch.cat([torch.tensor(flags, dtype=torch.float64, device=loss_sum.device),
                            losses])
        if self.world_size > 1:
            dist.all_reduce(values)
        read = values.tolist()  # one read of the device
        self.interval = max(1, int(read[3])) if self.target_s > 0 else 1
        self._since = 0
        self._window_started = now
        return Synced(tuple(v / self.dp for v in read[4:]), read[0] > 0, read[1] > 0,
                      read[2] > 0)


def train(
    spec: JobSpec,
    worker: WorkerInfo,
    sink: ProgressSink,
    checkpoint_root: Path | str,
    *,
    layout: Layout,
    stop_after_steps: int | None = None,
    progress_interval_s: float = 1.0,
    notices: Notices | None = None,
) -> dict[str, Any]:
    """Train `spec` on this worker; return the final figures (meaningful on rank 0).

    `layout`: the job's layout, as resolved once and stored with it (raytrain.core.resolve:
    `plan_summary(spec).layout`, or `job_layout(spec)` for a spec run outside the service);
    a worker never plans.

    `stop_after_steps` ends the run early after that many steps of this call (tests use it to
    compare a resumed run against an uninterrupted one). `notices`: this node's interruption
    notices; on one, every rank checkpoints at the same step (and stops, for an interruption:
    the result then says `preempted`). The service asks for the same through rank 0's sink
    (`should_move`) to move the job to other capacity.
    """
    notices = notices or NoNotices()
    training = spec.training
    model, optimizers, source, plan = build_rank(spec, layout, worker)
    checkpoints = CheckpointManager(
        checkpoint_root, worker.rank, keep=training.keep_checkpoints,
        world_size=worker.world_size, on_durable=sink.checkpoint if worker.rank == 0 else None)

    start_step, first_loss, loss_value = resume_rank(checkpoints, spec, model, optimizers, worker)
    sink.started(start_step)

    meter = start_meter(spec, model, start_step, first_loss, progress_interval_s)
    last_step = training.steps
    if stop_after_steps is not None:
        last_step = min(last_step, start_step + stop_after_steps)
    stopped = preempted = False
    steps_done = start_step
    sync = LossSync(worker.world_size, worker.rank, progress_interval_s / 2, dp=layout.dp)
    saved_at = time.monotonic()  # rank 0's clock: the service's interval counts from here
    unsynced: list[tuple[int, float, torch.Tensor, torch.Tensor]] = []  # step, lr, loss, norm
    for step in range(start_step, last_step):
        loss_sum, lr, grad_norm = _train_step(step, model, optimizers, source, plan, spec)
        steps_done = step + 1
        unsynced.append((steps_done, lr, loss_sum, grad_norm))
        checkpoint_due = after_step(steps_done, training.steps, training.checkpoint_every_steps,
                                    0.0, None).checkpoint
        if sync.due(forced=checkpoint_due or steps_done == last_step):
            rule, losses = _agree(steps_done, torch.stack([u[2] for u in unsynced]), sync,
                                  sink, notices, worker.rank == 0, spec,
                                  time.monotonic() - saved_at)
            loss_value = losses[-1]
            preempted = rule.preempted
            stopped = rule.stop
            checkpoint_due = checkpoint_due or rule.checkpoint
            if worker.rank == 0:
                _note_steps(meter, unsynced, losses)
            unsynced.clear()
            if meter.record(steps_done, loss_value) and worker.rank == 0:
                sink.progress(meter.snapshot())
        # A notice, a stop or the last step waits for the save to be durable; a periodic
        # one goes on behind training (skipped if the last one is still being stored).
        if checkpoint_due and save_step(checkpoints, steps_done, model, optimizers, {
                "samples_seen": plan.samples_consumed(steps_done),
                "first_loss": meter.first_loss, "loss": loss_value,
                "world_size": worker.world_size, "layout": asdict(layout),
        }, meter, wait=stopped or steps_done == last_step or notices.stop_requested):
            saved_at = time.monotonic()
        if stopped:
            if worker.rank == 0:
                logger.info("stopping at step %d: %s", steps_done,
                            "the node is being taken" if preempted else "the service asked")
            break
    checkpoints.flush()  # a periodic save still being stored (the last one waited)
    result = _result(spec, worker, meter, notices, steps_done - start_step, steps_done,
                     loss_value, stopped, preempted)
    if worker.rank == 0:
        sink.finished(result)
    return result


def start_meter(spec: JobSpec, model: ParallelModel, start_step: int,
                first_loss: float | None, interval_s: float) -> ProgressMeter:
    """The progress meter of a run going on from `start_step`; its reports say what FSDP
    shards (progress.fsdp_units)."""
    meter = ProgressMeter(spec.training.steps, spec.tokens_per_step, start_step, time.monotonic,
                          interval_s=interval_s, first_loss=first_loss)
    if model.fsdp_units is not None:
        meter.fixed["fsdp_units"] = model.fsdp_units
    return meter


def _note_steps(meter: ProgressMeter, unsynced: list[tuple[int, float, torch.Tensor,
                                                           torch.Tensor]],
                losses: tuple[float, ...]) -> None:
    """Every step's figures since the last sync, the gradient norms in one read of the
    device."""
    norms = torch.stack([u[3] for u in unsynced]).tolist()
    for (done, lr, _, _), loss, norm in zip(unsynced, losses, norms):
        meter.add_step(done, loss, lr, norm)


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
    optimizers = [build_optimizer(part, spec) for part in model.parts]
    source = build_source(spec.data, _vocab_size(spec))
    return model, optimizers, source, BatchPlan(training.global_batch_size,
                                                training.micro_batch_size, layout.dp)


def save_step(checkpoints: CheckpointManager, steps_done: int, model: ParallelModel,
          optimizers: list[torch.optim.Optimizer], meta: dict[str, Any], meter: ProgressMeter,
          wait: bool) -> bool:
    """Checkpoint this step; True if a save was made (a periodic one is skipped while the
    last is still being stored)."""
    save_s = checkpoints.save(steps_done, model.parts, optimizers, meta, wait=wait)
    if save_s is not None:
        meter.saved(save_s)
    return save_s is not None


def _agree(steps_done: int, loss_sum: torch.Tensor, sync: LossSync, sink: ProgressSink,
           notices: Notices, rank0: bool, spec: JobSpec, since_save_s: float
           ) -> tuple[StepRule, tuple[float, ...]]:
    """At a step where ranks sync: what every rank does next (stop, checkpoint, leave), from
    what each heard (rank 0: the service; every rank: its node's notices), and the loss."""
    training = spec.training
    interval_s = sink.checkpoint_every_s() if rank0 else None
    asked = after_step(steps_done, training.steps, training.checkpoint_every_steps,
                       since_save_s, interval_s)
    synced = sync.reduce(loss_sum, rank0 and sink.should_stop(),
                         notices.take_checkpoint_request() or asked.checkpoint,
                         notices.stop_requested or (rank0 and sink.should_move()))
    rule = after_step(steps_done, training.steps, training.checkpoint_every_steps, 0.0, None,
                      synced.stop, synced.checkpoint, synced.preempt)
    return rule, synced.losses


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
        return 0, None, float("nan")
    meta = checkpoints.load(latest, model.parts, optimizers)
    if worker.rank == 0:
        logger.info("resumed from %s at step %d", latest, meta["step"])
    return meta["step"], meta.get("first_loss"), meta.get("loss", float("nan"))


def _result(spec: JobSpec, worker: WorkerInfo, meter: ProgressMeter, notices: Notices,
            steps_run: int, steps_done: int, loss_value: float, stopped: bool, preempted: bool
            ) -> dict[str, Any]:
    """The run's final figures, as rank 0 reports them."""
    noticed_at = notices.noticed_at
    if preempted and worker.world_size > 1:  # the earliest notice of any rank's node
        earliest = torch.tensor(noticed_at or float("inf"), dtype=torch.float64,
                                device=worker.device)
        dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
        noticed_at = float(earliest) if float(earliest) != float("inf") else None
    wall_s = time.monotonic() - meter.started_at
    return {
        "first_loss": meter.first_loss if meter.first_loss is not None else loss_value,
        "final_loss": loss_value, "stopped": stopped, "preempted": preempted,
        # When this rank heard of the interruption, and when its checkpoint was durable.
        "noticed_at": noticed_at, "checkpointed_at": time.time() if preempted else None,
        "steps": steps_done, "train_wall_s": wall_s,
        "tokens_per_s": steps_run * spec.tokens_per_step / wall_s if wall_s > 0 else 0.0,
    }


def _train_step(
    step: int,
    model: ParallelModel,
    optimizers: list[torch.optim.Optimizer],
    source: TokenSource,
    plan: BatchPlan,
    spec: JobSpec,
) -> tuple[torch.Tensor, float, torch.Tensor]:
    """One optimizer step over the step's micro-batches; returns this rank's loss share, the
    learning rate of the update and the gradient norm before clipping (a tensor on the
    device, read in a batch at the next sync)."""
    training = spec.training
    lr = step_learning_rate(step, spec)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
    micro_batches = [
        source.batch(plan.sample_range(step, micro_step, model.dp_rank))
        for micro_step in range(plan.grad_accum_steps)
    ]
    loss_share = model.forward_backward(micro_batches)
    scaler = model.scaler
    if scaler is not None:
        for optimizer in optimizers:
            scaler.unscale_(optimizer)
    grad_norm = clip_grad_norm(model, training.grad_clip_norm)  # None: measured, not clipped
    for optimizer in optimizers:
        if scaler is not None:
            scaler.step(optimizer)
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if scaler is not None:
        scaler.update()
    return loss_share, lr, grad_norm


def step_learning_rate(step: int, spec: JobSpec) -> float:
    """The learning rate of step `step`'s update (counting from 0): the peak times the
    schedule's multiplier (raytrain.core.schedule; the README's "What a step does")."""
    training = spec.training
    return peak_learning_rate(training) * lr_multiplier(step, training.warmup, training.steps,
                                                        training.min_lr_ratio)
