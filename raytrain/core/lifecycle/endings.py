"""How a run's end moves its job (lifecycle.step's handler of RunEnded): on to the next
run after a preemption, a move or an error worth another try, else to SUCCEEDED or FAILED.
"""

from __future__ import annotations

from raytrain.core.lifecycle.events import RunEnded
from raytrain.core.lifecycle.values import (
    NOTICE_GRACE_S,
    Change,
    Rebuy,
    Run,
    StopRunner,
)
from raytrain.spec import JobResult, JobState, PreemptionRecord


def run_ended(c: Change, event: RunEnded) -> None:
    run = c.run
    if run is None:
        return
    c.effects.append(StopRunner(reclaim=run.groups > 1))
    c.job.groups = []  # the run's replica groups are gone with it
    if c.job.state.is_terminal:  # a cancelled job already has its end
        c.run = None
        return
    c.bill()
    error = event.error
    if error is None and not run.result:
        error = "training ended without a final report"
    if error is None and run.over_budget and (run.result or {}).get("preempted"):
        saved = c.job.checkpoint.step if c.job.checkpoint else 0
        error = (f"budget reached: ${c.job.cost_usd:,.2f} spent of ${run.budget_usd:,.2f}; "
                 f"stopped with a checkpoint at step {saved}, which is kept with the job. To "
                 "fix: go on from it with a larger budget (raytrain resume "
                 f"{c.job.id} --budget-usd N)")
    if not recovered(c, run, error, event.alive):
        finish(c, run, error)
    c.run = None


def recovered(c: Change, run: Run, error: str | None, alive: frozenset[str]) -> bool:
    """On bought capacity, the manager (not Ray Train) restarts a stopped worker group: after
    a notice (the workers checkpointed and stopped), after a node loss without one (a
    preemption too: it never uses the failure budget), or after an error worth another try.
    True if the job goes on."""
    job, result = c.job, run.result or {}
    if run.over_budget:
        return False  # stopped for its budget: a retry would spend past it
    preempted = error is None and bool(result.get("preempted"))
    if preempted and run.moving_to:
        c.move(JobState.RECOVERING, f"moving to {run.moving_to} from step "
               f"{result.get('steps')}, as the policy decided")
        return True
    if preempted:
        notice = True
    elif error is not None and run.nodes_at_launch - alive:
        notice = False
    elif error is not None and worth_retrying(c, run, error):
        job.restarts += 1
        c.move(JobState.RECOVERING, f"restarting after an error "
               f"({job.restarts} of {job.spec.training.max_restarts}): {error}")
        return True
    else:
        return False
    saved = job.checkpoint.step if job.checkpoint else None
    # After a notice the workers say where they stopped; after a loss, the last report (sent
    # about once a second) is all there is: a lower bound.
    reached = int(result.get("steps") or max(job.progress.step, run.progress_step, saved or 0))
    noticed, durable = result.get("noticed_at"), result.get("checkpointed_at")
    record = PreemptionRecord(
        time=c.now, notice=notice, reached_step=reached, checkpoint_step=saved,
        lost_steps=max(0, reached - (saved or 0)),
        notice_to_checkpoint_s=durable - noticed if noticed and durable else None,
        before=run.describe)
    job.preemptions += 1
    job.preemption_log.append(record)
    job.lost_steps += record.lost_steps
    c.effects.append(Rebuy(run.nodes_at_launch))  # on bought nodes: decide where it resumes
    if notice:  # the noticed nodes go within two minutes: do not start on them again
        c.leaving = (c.now + NOTICE_GRACE_S, run.nodes_at_launch)
    c.emit("preemption", record.model_dump(mode="json"))
    c.move(JobState.RECOVERING, (
        f"preempted {'after a notice' if notice else 'without notice'} at step {reached}; "
        f"resuming from step {saved or 0} on the policy's next-best capacity"))
    return True


def worth_retrying(c: Change, run: Run, error: str) -> bool:
    """Retry a failed run only if another try could go differently: not when it failed before
    its first training step (building the model, data or layout fails the same way every
    time), not when the same error ends a run at the same step twice, and not past
    training.max_restarts."""
    failed_at = max(run.progress_step, c.job.progress.step)
    previous, c.last_failure = c.last_failure, (error, failed_at)
    if run.progress_step < 0 or previous == (error, failed_at):
        return False
    return c.job.restarts < c.job.spec.training.max_restarts


def finish(c: Change, run: Run, error: str | None) -> None:
    job = c.job
    job.finished_at = c.now
    if error is None:
        assert run.result is not None
        job.result = JobResult.model_validate({k: run.result[k] for k in JobResult.model_fields})
        c.move(JobState.SUCCEEDED, "finished")
    else:
        job.error = error
        c.move(JobState.FAILED, (f"failed; each worker's output is in `raytrain logs {job.id}` "
                                 f"(GET /v1/jobs/{job.id}/logs)"))
    c.end()
