"""What each event does to a job (raytrain.core.lifecycle.step dispatches here): one function
per event, over a `Change` (the step's working copy). Recovery after a preemption or an
error, billing and preemption accounting are decided here.
"""

from __future__ import annotations

import math
from typing import Any

from raytrain.catalog.prices import usd_for
from raytrain.core.lifecycle.events import (
    CancelRequested,
    CapacityDecided,
    CheckpointCommitted,
    FinalReport,
    GroupStarted,
    Launched,
    NodesHeld,
    Passed,
    ProgressReported,
    Queued,
    Reviewed,
    ServiceRestarted,
    ServiceStopping,
    StopOverdue,
    Submitted,
    TrackingNoted,
)
from raytrain.core.lifecycle.values import (
    CANCEL_GRACE_S,
    PROGRESS_SAVE_INTERVAL_S,
    Change,
    StopRunner,
    checkpoint_every_s,
    enter,
    sampled,
    stale_checkpoint_warning,
)
from raytrain.spec import (
    CheckpointInfo,
    DecisionRecord,
    GroupStatus,
    JobState,
    Progress,
    Resources,
)


def submitted(c: Change, event: Submitted) -> None:
    c.move(JobState.PENDING, "queued")


def queued(c: Change, event: Queued) -> None:
    if c.job.message != event.message:
        c.move(JobState.PENDING, event.message)


def passed(c: Change, event: Passed) -> None:
    c.passed += 1


def capacity_decided(c: Change, event: CapacityDecided) -> None:
    if event.costs is not None:
        c.job.costs = event.costs.model_copy(update={
            "checkpoint_stall_s": c.job.costs.checkpoint_stall_s.model_copy(update={
                "assumed_s": event.costs.checkpoint_stall_s.assumed_s,
                "used_s": event.costs.checkpoint_stall_s.used_s}),
            "checkpoint_durable_s": c.job.costs.checkpoint_durable_s.model_copy(update={
                "assumed_s": event.costs.checkpoint_durable_s.assumed_s,
                "used_s": event.costs.checkpoint_durable_s.used_s}),
            "restart_s": c.job.costs.restart_s.model_copy(update={
                "assumed_s": event.costs.restart_s.assumed_s,
                "used_s": event.costs.restart_s.used_s})})
    if event.reference_usd is not None and c.job.reference_usd is None:
        c.job.reference_usd = event.reference_usd
    last = c.job.decisions[-1] if c.job.decisions else None
    if last is not None and _same_decision(last, event.decision) and (
            event.resources is None or event.resources == c.job.resources):
        return  # decided again, the same way for the same reason: one record is enough
    c.job.decisions.append(event.decision)
    if event.resources is not None:
        c.job.resources = event.resources
    state = JobState.RECOVERING if c.job.state == JobState.RECOVERING else \
        JobState.PROVISIONING if event.resources is not None else JobState.PENDING
    c.move(state, event.message)


def _same_decision(a: DecisionRecord, b: DecisionRecord) -> bool:
    return (a.event, a.action, a.offer, a.market, a.nodes, a.checkpoint_interval_s,
            a.reason) == (b.event, b.action, b.offer, b.market, b.nodes,
                          b.checkpoint_interval_s, b.reason)


def nodes_held(c: Change, event: NodesHeld) -> None:
    c.hold(event.nodes, event.usd_per_hour)
    c.save = True


def launched(c: Change, event: Launched) -> None:
    c.run = event.run
    old = c.job.plan
    if event.plan is not None and event.plan != old:  # bought capacity: its own layout
        same = old is not None and old.layout == event.plan.layout
        c.job.plan = event.plan.model_copy(
            update={"measured_step_s": old.measured_step_s if same and old else None})
    c.passed, c.leaving = 0, None
    if c.job.state != JobState.RECOVERING:
        c.move(JobState.PROVISIONING, "starting the worker group")


def group_started(c: Change, event: GroupStarted) -> int:
    if c.run is None:
        return -1
    c.set_run(attempt=c.run.attempt + 1, progress_step=-1,
              placement_group=event.placement_group)
    job = c.job
    if job.state.is_terminal:  # cancelled while the group was starting: stop now
        c.set_run(stop_by=c.now + CANCEL_GRACE_S)
        return -1
    if job.resources.node_type is None:  # a fixed cluster: what the workers found
        job.resources = Resources(
            accelerator=event.accelerator, market="local", nodes=event.nodes,
            gpus=c.run.demand.get("GPU", 0.0), cpus=c.run.demand.get("CPU", 0.0),
            usd_per_hour=0.0)
    if job.started_at is None:
        job.started_at = c.now
    job.groups = [GroupStatus(index=i, state="training", since=c.now)
                  for i in range(c.run.groups)] if c.run.groups > 1 else []
    if c.run.attempt == 1 and job.restarts == 0 and job.state != JobState.RECOVERING:
        c.move(JobState.RUNNING, "training")
    else:
        if c.run.attempt > 1:
            job.restarts += 1
        c.move(JobState.RECOVERING,
               f"worker group restarted; resuming from step {event.resumed_step}",
               resumed_step=event.resumed_step)
    return c.run.attempt


def progress(c: Change, event: ProgressReported) -> dict[str, Any]:
    """The reply tells rank 0 whether to stop, to checkpoint and stop (a move), and how often
    to checkpoint: the policy's interval for the capacity held (None: the job's own steps)."""
    run, job = c.run, c.job
    if run is None or event.attempt != run.attempt:
        return {"stop": True}  # a report from a run no longer tracked
    if run.stop_by is not None or job.state.is_terminal:
        return {"stop": True}
    reply = {"stop": False, "move": run.moving_to is not None or run.over_budget,
             "checkpoint_every_s": checkpoint_every_s(job)}
    step_reached = int(event.payload["step"])
    if step_reached < run.progress_step:  # overtaken by a later report
        return reply
    first_report = run.progress_step < 0
    c.set_run(progress_step=step_reached)
    c.bill()
    if first_report:  # capacity in hand (the launch) to the first step: a restart measured
        job.costs.restart_s = sampled(job.costs.restart_s, c.now - run.launched_at, mean=True)
    if run.budget_usd is not None and job.cost_usd >= run.budget_usd and not run.over_budget:
        # Checkpoint at the next step and stop, as for a move; the run's end fails the job.
        c.set_run(over_budget=True)
        reply = {"stop": False, "move": True}
    if first_report and job.preemption_log and job.preemption_log[-1].after is None:
        resumed_after_preemption(c)
    if job.state == JobState.RECOVERING:
        c.move(JobState.RUNNING, "training")
    job.progress = Progress.model_validate(
        {k: v for k, v in event.payload.items() if k != "sent_at"})
    if job.progress.val_loss is not None:
        job.progress.val_perplexity = math.exp(min(job.progress.val_loss, 700.0))
    if job.plan is not None and job.progress.step_s:
        job.plan.measured_step_s = job.progress.step_s
    elif job.plan is not None and job.progress.tokens_per_s:  # a worker of an older version
        job.plan.measured_step_s = job.plan.tokens_per_step / job.progress.tokens_per_s
    # sent_at stays in the event: followers can see how fresh each report is. Dollars go
    # with it, so a follower (the dashboard's charts, serve.jobs.history) needs nothing else.
    c.emit("progress", {**event.payload, "cost_usd": job.cost_usd,
                        "usd_per_hour": job.resources.usd_per_hour,
                        **({"val_perplexity": job.progress.val_perplexity}
                           if job.progress.val_perplexity is not None else {})})
    warning = stale_checkpoint_warning(job, run.launched_at, c.now)
    if warning is not None and job.warning is None:
        c.save = True
    job.warning = warning
    if c.now - c.saved_at >= PROGRESS_SAVE_INTERVAL_S:
        c.save = True
    return reply


def resumed_after_preemption(c: Change) -> None:
    assert c.run is not None
    job, last = c.job, c.job.preemption_log[-1].model_copy()  # the record's stays as it was
    job.preemption_log[-1] = last
    last.after = c.run.describe
    last.capacity_to_first_step_s = c.now - c.run.launched_at
    last.down_s = c.now - last.time
    step_s = job.plan.measured_step_s if job.plan and job.plan.measured_step_s else 0.0
    last.extra_cost_usd = usd_for(job.resources.usd_per_hour,
                                  last.down_s + last.lost_steps * step_s)
    job.down_s += last.down_s
    job.preemption_cost_usd += last.extra_cost_usd
    c.save = True


def checkpoint(c: Change, event: CheckpointCommitted) -> None:
    if c.run is None or event.attempt != c.run.attempt:
        return
    durable_s = event.durable_s if event.durable_s is not None else event.save_s
    c.job.checkpoint = CheckpointInfo(step=event.step, path=event.path, save_s=event.save_s,
                                      durable_s=durable_s, committed_at=c.now)
    c.job.warning = None
    if c.job.progress.step < event.step:  # saved past the last report (a notice, the end)
        c.job.progress = c.job.progress.model_copy(update={"step": event.step})
    if event.save_s is not None:
        costs = c.job.costs
        costs.checkpoint_stall_s = sampled(costs.checkpoint_stall_s, event.save_s)
    if durable_s is not None:
        costs = c.job.costs
        costs.checkpoint_durable_s = sampled(costs.checkpoint_durable_s, durable_s)
    if not c.job.state.is_terminal:  # a cancelled job's stream has already ended
        c.emit("checkpoint", {"step": event.step, "path": event.path,
                              "save_s": event.save_s, "durable_s": durable_s})
    c.save = True


def final_report(c: Change, event: FinalReport) -> None:
    if c.run is not None and event.attempt == c.run.attempt:
        c.set_run(result=dict(event.result))


def stop_overdue(c: Change, event: StopOverdue) -> None:
    if c.run is not None:
        c.effects.append(StopRunner(hard=True, placement_group=c.run.placement_group))
        c.run = None


def cancel(c: Change, event: CancelRequested) -> None:
    if c.run is not None and c.run.attempt == 0:
        # Its group never started (Ray Train starting it, or its nodes still booting): no
        # step to finish, no checkpoint to save. Stopping the runner stops Ray Train's
        # start, and Ray removes the placement group with the runner's controller, so its
        # capacity is free in seconds rather than after the start it would abandon.
        c.effects.append(StopRunner(hard=True, placement_group=None))
        c.run = None
    elif c.run is not None:
        # Rank 0 reads the stop in the reply to its next report and every rank leaves at the
        # same step; the run keeps its resources counted until the group is gone.
        c.set_run(stop_by=c.now + CANCEL_GRACE_S)
    c.job.finished_at = c.now
    c.move(JobState.CANCELLED, "cancelled by request")
    c.end()


def reviewed(c: Change, event: Reviewed) -> None:
    if c.run is None:
        return
    c.set_run(reviewed_at=c.now)
    if event.decision is None:
        return
    c.job.decisions.append(event.decision)
    c.save = True
    if event.moving_to is None:  # it stays, checkpointing at a new interval
        return
    if event.resources is not None:
        c.job.resources = event.resources
    c.set_run(moving_to=event.moving_to)
    c.job.message = f"moving to {event.moving_to} at a checkpoint: {event.decision.reason}"


def service_restarted(c: Change, event: ServiceRestarted) -> None:
    was = c.job.state
    if was.is_terminal:
        return
    if was in (JobState.RUNNING, JobState.RECOVERING, JobState.PROVISIONING) \
            and c.job.started_at is not None:
        c.job.restarts += 1
    c.run = None
    c.hold(frozenset(), 0.0)  # billed to now; the new placement finds its nodes again
    enter(c.job, JobState.PENDING, f"the service restarted while the job was {was.value}; "
          "it resumes from its latest checkpoint")
    c.save = True  # the stream of a reloaded job starts from its record


def service_stopping(c: Change, event: ServiceStopping) -> None:
    if c.run is not None:
        c.effects.append(StopRunner(hard=True, placement_group=c.run.placement_group))
        c.run = None
    if not c.job.state.is_terminal:
        c.job.message = "the service stopped; the job resumes from its checkpoint on restart"
        c.save = True


def tracking_noted(c: Change, event: TrackingNoted) -> None:
    before, after = c.job.tracking, event.tracking
    c.job.tracking = after
    runs_before = {k: r.run_id for k, r in before.runs.items()} if before is not None else {}
    if runs_before != {k: r.run_id for k, r in after.runs.items()} or \
            (before.warning if before is not None else None) != after.warning or \
            c.job.state.is_terminal:
        c.save = True
