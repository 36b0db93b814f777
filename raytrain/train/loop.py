"""The training loop: every step of every job, rigid or in replica groups. Knows nothing of
Ray.

The same function runs inside Ray Train workers (raytrain.train.launcher and
elastic_launcher), on a pod (raytrain.train.pod_main), under torchrun in benchmarks, and in
one plain process in tests; the caller passes who this worker is, where checkpoints live,
where progress goes, and the group it trains in. The process group, if any, is already set up.

    result = train(spec, WorkerInfo.single_process(), NullSink(), Path("/tmp/ckpt"),
                   layout=job_layout(spec))

Order of work: build this rank's share of the model under the layout
(raytrain.parallel.parallelize), one AdamW per model part, resume from the latest checkpoint
if there is one, then for each step:

1. `members.turn`: the step to train and this rank's micro-batches of it. Alone (a rigid
   job, `OneGroup`) that is every micro-batch of the next step; in one of several replica
   groups (raytrain.train.replica_group.ReplicaGroup) the step's quorum decides both, and a group
   behind heals from a live peer first.
2. Forward and backward over them (raytrain.train.rank.forward_backward), read one step
   ahead on a thread (raytrain.data.prefetch), so the step does not wait for its data.
3. `members.exchange`: the groups sum their gradients and the loss, and learn the service's
   stop and move from the group that leads; a step a group died in is done again.
4. The update (clipping across every shard and stage, the learning-rate schedule).
5. Every few steps (every step with replica groups) the group's ranks agree on the loss and
   on what to do next (raytrain.train.sync): checkpoint (every `checkpoint_every_steps`,
   when the service's interval for the capacity held has passed, on a notice, at the end),
   stop (the service's cancel or move, a node's notice), or, for a replica group whose node
   has its notice while others train on, leave without a checkpoint (raytrain.core.step_rules
   decides, for the simulator too). The leading group's rank 0 reports every step's figures.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import torch
import torch.distributed as dist

from raytrain.core.step_rules import StepRule, after_step
from raytrain.data.prefetch import Prefetcher, loss_scale
from raytrain.data.validation import with_validation
from raytrain.spec import JobSpec
from raytrain.spec.layout import Layout
from raytrain.train.checkpoint import CheckpointManager
from raytrain.train.progress import ProgressMeter, ProgressSink
from raytrain.train.rank import (
    NoNotices,
    Notices,
    WorkerInfo,
    build_rank,
    export_at_end,
    forward_backward,
    optimizer_step,
    resume_rank,
    save_step,
    start_meter,
    validation_loss,
)
from raytrain.train.sync import Heard, LossSync

logger = logging.getLogger(__name__)


class Turn(NamedTuple):
    """This rank's part of one step."""

    step: int  # the step to train (counting from 0)
    units: list[int]  # its micro-batch indices of the step
    share: float  # the part of the step's micro-batches they are
    leads: bool  # its group reports progress and writes checkpoints
    alive: int  # the groups training this step


class Exchanged(NamedTuple):
    loss: torch.Tensor  # this rank's share of the step's loss, summed over the groups
    stop: bool  # the service's cancel, as the leading group heard it
    move: bool  # the service's move, likewise


class Members(Protocol):
    """The groups a rank trains among (module doc, steps 1 and 3)."""

    every_step: bool  # agree after every step: groups must stop at the same step
    heals: bool  # it joins live groups: its state comes from one of them, not from storage

    def start(self, step: int, model: Any, optimizers: list[torch.optim.Optimizer],
              meter: Any) -> None:
        ...  # meter: the rank's ProgressMeter (a group that heals takes the job's first loss)

    def turn(self, step: int, units: int) -> Turn: ...

    def exchange(self, step: int, model: Any, loss: torch.Tensor, stop: bool, move: bool
                 ) -> Exchanged | None: ...  # None: not committed, do the step again

    def ends_job(self, left: bool, came_after_end: bool) -> bool: ...  # its end is the job's

    def progress(self, turn: Turn) -> dict[str, Any]: ...  # more figures for its reports

    def close(self) -> None: ...


class OneGroup:
    """A job whose ranks all train as one group (a rigid job): every step is theirs."""

    every_step = False
    heals = False

    def start(self, step: int, model: Any, optimizers: list[torch.optim.Optimizer],
              meter: Any) -> None:
        pass

    def turn(self, step: int, units: int) -> Turn:
        return Turn(step, list(range(units)), 1.0, True, 1)

    def exchange(self, step: int, model: Any, loss: torch.Tensor, stop: bool, move: bool
                 ) -> Exchanged:
        return Exchanged(loss, stop, move)

    def ends_job(self, left: bool, came_after_end: bool) -> bool:
        return True

    def progress(self, turn: Turn) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


@dataclass
class _Unsynced:
    """The committed steps since the ranks last agreed, and what rank 0 heard in them."""

    steps: list[tuple[int, float, torch.Tensor, torch.Tensor, int | None]] = field(
        default_factory=list)
    stop: bool = False
    move: bool = False

    def add(self, steps_done: int, lr: float, exchanged: Exchanged,
            grad_norm: torch.Tensor, tokens: int | None) -> None:
        self.steps.append((steps_done, lr, exchanged.loss, grad_norm, tokens))
        self.stop, self.move = self.stop or exchanged.stop, self.move or exchanged.move

    def note(self, meter: ProgressMeter, losses: tuple[float, ...],
             balance: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """Every step's figures into the meter, the gradient norms in one read of the
        device; a mixture of experts' latest balancing loss and imbalance in another."""
        norms = torch.stack([s[3] for s in self.steps]).tolist()
        for (done, lr, _, _, tokens), loss, norm in zip(self.steps, losses, norms):
            meter.add_step(done, loss, lr, norm, tokens)
        if balance is not None:
            figure, imbalance = torch.stack(balance).tolist()
            meter.fixed.update(balance_loss=figure, expert_imbalance=imbalance)


@dataclass
class _Ending:
    stopped: bool = False
    preempted: bool = False  # stopped for a node's notice or a move, with a checkpoint
    left: bool = False  # a replica group that left on its node's notice; others train on


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
    members: Members | None = None,
) -> dict[str, Any]:
    """Train `spec` on this worker; return the final figures (meaningful on rank 0).

    `layout`: the layout of this rank's group, as resolved once and stored with the job
    (raytrain.core.resolve); a worker never plans. `members`: the groups this rank trains
    among (`OneGroup()` by default). `stop_after_steps` ends the run early after that many
    steps of this call (tests compare a resumed run with an uninterrupted one). `notices`:
    this node's interruption notices.
    """
    notices, members = notices or NoNotices(), members or OneGroup()
    training = spec.training
    model, optimizers, source, plan = build_rank(spec, layout, worker)
    try:
        source, held_out = with_validation(
            spec.data, spec.model.gpt.vocab_size if spec.model.builtin else None, source)
        checkpoints = CheckpointManager(
            checkpoint_root, worker.rank, keep=training.keep_checkpoints,
            world_size=worker.world_size,
            on_durable=sink.checkpoint if worker.rank == 0 else None)
        # A group joining live ones reads nothing from storage: it heals at its first quorum.
        start_step, first_loss, loss_value = (0, None, float("nan")) if members.heals else \
            resume_rank(checkpoints, spec, model, optimizers, worker)
        data = Prefetcher(source, plan, model.dp_rank, worker.device)  # the next step read ahead
    except BaseException:
        model.close()  # nothing it started outlives a run that could not start
        raise
    last_step = training.steps if stop_after_steps is None else min(
        training.steps, start_step + stop_after_steps)
    meter = start_meter(spec, model, start_step, first_loss, progress_interval_s)
    try:
        members.start(start_step, model, optimizers, meter)
        sink.started(start_step)
    except BaseException:
        data.close()
        model.close()
        raise
    sync = LossSync(worker.world_size, worker.rank,
                    0.0 if members.every_step else progress_interval_s / 2, dp=layout.dp,
                    device=worker.device)
    ending, unsynced = _Ending(), _Unsynced()
    saved_at = time.monotonic()  # rank 0's clock: the service's interval counts from here
    steps_done, leads = start_step, True
    try:
        while steps_done < last_step:
            began = time.monotonic()
            turn = members.turn(steps_done, plan.grad_accum_steps)
            if turn.step >= last_step:  # healed from a group that has finished
                steps_done = turn.step
                break
            reporter, leads = worker.rank == 0 and turn.leads, turn.leads
            batches, trained = data.get(turn.step, turn.units) if turn.units else ([], None)
            # masked data: each micro-batch's summed loss over the step's trained targets
            model.loss_scale = loss_scale(plan, trained)
            loss = forward_backward(model, batches, turn.share)
            exchanged = members.exchange(turn.step, model, loss,
                                         reporter and sink.should_stop(),
                                         reporter and sink.should_move())
            if exchanged is None:  # a group died mid-step: do it again
                continue
            lr, grad_norm = optimizer_step(model, optimizers, spec, turn.step)
            if model.compiled and turn.step == start_step:  # compiling: not a step's time
                meter.warmed_up(time.monotonic() - began)
            meter.waited_for_data(data.take_waited_s())
            steps_done = turn.step + 1
            if held_out is not None and _validation_due(spec, steps_done, last_step):
                data.settle()  # the held-out windows come from the same source
                measured = time.monotonic()
                meter.validated(steps_done, validation_loss(
                    model, held_out, plan, training.eval_batches, worker, layout.dp),
                    time.monotonic() - measured)
            unsynced.add(steps_done, lr, exchanged, grad_norm, trained)
            rule = after_step(steps_done, training.steps, training.checkpoint_every_steps,
                              0.0, None)
            if sync.due(forced=rule.checkpoint or steps_done == last_step):
                since_save_s = time.monotonic() - saved_at
                rule, losses = _agree(sync, unsynced, turn, reporter, sink, notices, spec,
                                      steps_done, since_save_s, ending)
                loss_value = losses[-1]
                if reporter:
                    unsynced.note(meter, losses, model.balance)
                unsynced = _Unsynced()
                if meter.record(steps_done, loss_value,
                                last=rule.stop or steps_done == last_step) and reporter:
                    sink.progress({**meter.snapshot(), **members.progress(turn)})
            # A notice, a stop or the last step waits for the save to be durable; a periodic
            # one goes on behind training (skipped if the last one is still being stored).
            if rule.checkpoint and turn.leads and not ending.left and save_step(
                    checkpoints, steps_done, model, optimizers, {
                        "samples_seen": plan.samples_consumed(steps_done),
                        "first_loss": meter.first_loss, "loss": loss_value,
                        "world_size": worker.world_size, "layout": asdict(layout)},
                    meter, wait=rule.stop or steps_done == last_step or notices.stop_requested):
                saved_at = time.monotonic()
            if rule.stop:
                break
        checkpoints.flush()  # a periodic save still being stored (the last one waited)
        if steps_done >= training.steps > start_step and not ending.stopped and leads:
            export_at_end(spec, model, checkpoint_root, worker)
    finally:
        members.close()
        data.close()
        model.close()
    result = _result(spec, worker, meter, notices, steps_done - start_step, steps_done,
                     loss_value, ending)
    if worker.rank == 0 and members.ends_job(ending.left, start_step >= training.steps):
        sink.finished(result)
    return result


def _validation_due(spec: JobSpec, steps_done: int, last_step: int) -> bool:
    """Every eval_every_steps (default: checkpoint_every_steps) and at the run's end: from
    the step alone, so every rank and group measures at the same steps."""
    training = spec.training
    every = training.eval_every_steps or training.checkpoint_every_steps
    return steps_done % every == 0 or steps_done == last_step


def _agree(sync: LossSync, unsynced: _Unsynced, turn: Turn, reporter: bool, sink: ProgressSink,
           notices: Notices, spec: JobSpec, steps_done: int, since_save_s: float,
           ending: _Ending) -> tuple[StepRule, tuple[float, ...]]:
    """At a step where the group's ranks sync: what every rank does next, from what each
    heard (the reporter: the service; every rank: its node's notices), and the losses of
    the steps since the last sync. Sets `ending` when the rank stops or leaves."""
    training = spec.training
    interval_s = sink.checkpoint_every_s() if reporter else None
    on_time = after_step(steps_done, training.steps, training.checkpoint_every_steps,
                         since_save_s, interval_s).checkpoint
    synced = sync.reduce(torch.stack([s[2] for s in unsynced.steps]), Heard(
        stop=unsynced.stop, checkpoint=notices.take_checkpoint_request() or on_time,
        move=unsynced.move, notice=notices.stop_requested))
    heard = synced.heard
    # A replica group whose node is being taken leaves while others train on; the last group
    # alive (or a rigid job) checkpoints and stops instead.
    leaves = heard.notice and turn.alive > 1
    rule = StepRule(checkpoint=False, stop=True, preempted=False) if leaves else after_step(
        steps_done, training.steps, training.checkpoint_every_steps, 0.0, None, heard.stop,
        heard.checkpoint, heard.move or heard.notice)
    if rule.stop:
        ending.stopped, ending.preempted, ending.left = True, rule.preempted, leaves
        if reporter or leaves:
            logger.info("stopping at step %d: %s", steps_done,
                        "the node is being taken" if heard.notice else
                        "the job moves" if heard.move else "the service asked")
    return rule, synced.losses


def _result(spec: JobSpec, worker: WorkerInfo, meter: ProgressMeter, notices: Notices,
            steps_run: int, steps_done: int, loss_value: float, ending: _Ending
            ) -> dict[str, Any]:
    """The run's final figures, as rank 0 reports them (`left`: its replica group left on
    its node's notice)."""
    noticed_at = notices.noticed_at
    if (ending.preempted or ending.left) and worker.world_size > 1:  # any rank's, earliest
        earliest = torch.tensor(noticed_at or float("inf"), dtype=torch.float64,
                                device=worker.device)
        dist.all_reduce(earliest, op=dist.ReduceOp.MIN)
        noticed_at = float(earliest) if float(earliest) != float("inf") else None
    wall_s = time.monotonic() - meter.started_at
    return {
        "first_loss": meter.first_loss if meter.first_loss is not None else loss_value,
        "final_loss": loss_value, "stopped": ending.stopped, "preempted": ending.preempted,
        "left": ending.left,
        # When this rank heard of the interruption, and when its checkpoint was durable.
        "noticed_at": noticed_at, "checkpointed_at": time.time() if ending.preempted else None,
        "steps": steps_done, "train_wall_s": wall_s,
        "tokens_per_s": (meter.tokens_total or steps_run * spec.tokens_per_step) / wall_s
        if wall_s > 0 else 0.0,
    }
