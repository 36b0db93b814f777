"""Five preemptions of both kinds and a move in one job, in one process: the real job
manager, scheduler, lifecycle and policy, with the real training loop resuming from its
checkpoints each time (tests/fake_ray.TrainingRay runs it in a thread, one rank, and buys a
node for each one the job manager requests). The same story runs on Ray's autoscaler and
pods from a fake RunPod in tests/service/ray/test_autoscaling.py, with one preemption of each
kind: every Ray Train start costs tens of seconds there."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raytrain.serve.jobs.manager import JobManager
from raytrain.spec import JobSpec, JobState, ServiceConfig
from raytrain.testing.fake_ray import TrainingRay
from raytrain.testing.jobs import OFFER, job
from raytrain.testing.runs import run_single
from tests.support.tolerances import SUM_ORDER

STEPS = 160




def write_offers(path: Path, on_demand_usd_per_hour: float) -> None:
    """One offer, a 1-CPU node: the job's single rank fits it. Prices are high enough that,
    by the planner's figure for this CPU, the work left when on-demand becomes cheap pays for
    the move (the policy's assumed 300 s restart)."""
    path.write_text(yaml.safe_dump({"version": "test", "offers": [
        {**OFFER, "on_demand_usd_per_hour": on_demand_usd_per_hour}]}))


def test_five_preemptions_of_both_kinds_then_a_move_end_as_an_uninterrupted_run(
        tmp_path: Path) -> None:
    """Notice, loss, notice, loss, notice: after a notice the job checkpoints at once and
    loses no step; after a loss it loses at most the checkpoint interval. Each time the node
    is bought again and the job resumes from its checkpoint, never touching the failure
    budget. Then on-demand becomes far cheaper than spot and the policy moves the job there
    at a checkpoint taken for it. The final loss is the uninterrupted run's."""
    offers = tmp_path / "offers.yaml"
    write_offers(offers, 1.0)
    config = ServiceConfig(
        state_dir=str(tmp_path / "state"), offers_file=str(offers), scheduler_interval_s=0.05,
        node_types={"cpu-spot": {"offer": "local/here/cpu-1", "market": "spot", "max_nodes": 1},
                    "cpu-on-demand": {"offer": "local/here/cpu-1", "market": "on-demand",
                                      "max_nodes": 1}})
    faults = {15: True, 33: False, 52: True, 77: False, 95: True}
    cluster = TrainingRay(cpus=1, faults=dict(faults), hold_at=120)

    def move_when_held(job_id: str) -> None:
        if cluster.held.is_set() and not cluster.go.is_set():
            assert cluster.manager.records[job_id].status.preemptions == 5 and not cluster.faults
            write_offers(offers, 0.0001)  # on-demand is now far cheaper than spot
            cluster.manager.scheduler.pass_once()  # the policy looks again and decides the move
            cluster.go.set()

    job_id = cluster.train_to_the_end(config, job(), between=move_when_held)
    manager = cluster.manager

    final = manager.records[job_id].status
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.preemptions == 5 and final.restarts == 0  # the failure budget is untouched
    log = final.preemption_log
    assert [r.notice for r in log] == list(faults.values())
    assert [r.reached_step for r in log if not r.notice] == [32, 76]  # the last reports
    # The checkpoint each preemption went back to: the last one reported durable before it.
    events = manager.wait_events(job_id, 0, 0.0) or []
    durable = [0]
    went_back_to = []
    for event in events:
        if event["type"] == "checkpoint":
            durable.append(event["data"]["step"])
        elif event["type"] == "preemption":
            went_back_to.append(durable[-1])
    assert went_back_to == [r.checkpoint_step for r in log]
    resumed_at = 0
    for record in log:
        if record.notice:  # checkpointed one step after hearing it: nothing lost
            assert record.lost_steps == 0 and record.checkpoint_step == record.reached_step
            assert record.notice_to_checkpoint_s is not None
        else:  # back to the last checkpoint reported committed as the node went: the
            # interval's last (2 and 6 steps lost here), or an earlier one while saves, which
            # run behind training, were still being stored on a busy host (step 30's commit
            # not reported by step 33; once neither 20's nor 30's: back to the notice's 16)
            assert resumed_at <= record.checkpoint_step < record.reached_step
            assert record.checkpoint_step in (resumed_at, *range(10, record.reached_step, 10))
            assert 0 < record.lost_steps == record.reached_step - record.checkpoint_step
        resumed_at = record.checkpoint_step
    assert final.lost_steps == sum(r.lost_steps for r in log)
    moves = [d for d in final.decisions if d.event != "progress"]  # reviews: a new interval
    assert [d.event for d in moves] == ["submit"] + ["preemption"] * 5 + ["prices"]
    move = final.decisions[-1]
    assert move.action == "switch" and move.market == "on-demand" and "saves" in move.reason
    assert final.resources.node_type == "cpu-on-demand"
    assert cluster.launched == 7  # the first run, one per preemption, one after the move
    assert cluster.requests[job_id] == []  # the nodes are let go
    # The spot exposure the policy's rate is estimated from outlives the service.
    count, node_hours = manager.provisioner.history["local/here/cpu-1"]
    assert count == 5 and node_hours > 0
    # Nodes asked for to nodes up, per market: the spot runs' own, the move's on-demand apart.
    ready = manager.provisioner.ready["local/here/cpu-1@spot"]
    assert ready[0] >= 6
    again = JobManager(config.model_dump(mode="json"), cluster=TrainingRay(cpus=1),
                       schedule=False).start()
    assert again.provisioner.history["local/here/cpu-1"] == (count, node_hours)
    assert again.provisioner.ready["local/here/cpu-1@spot"] == ready
    # ... and a decision after the restart prices with what was measured before it.
    assert "ready:local/here/cpu-1@spot" in again.provisioner.costs_for(final).measured
    reference = run_single(JobSpec.model_validate(job()), tmp_path / "reference")
    assert final.result.final_loss == pytest.approx(reference.result["final_loss"], abs=SUM_ORDER)
