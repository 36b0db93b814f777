"""The capacity engine the live service decides with (and a replay of a trace, which is the
live service): what it remembers between decisions, with plain values and the live
provisioner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from raytrain.core.autoscale import options
from raytrain.core.engine import CapacityEngine, EngineEvent
from raytrain.core.resolve import plan_summary
from raytrain.core.throughput import job_goal, job_throughput
from raytrain.serve.jobs.provisioning import Provisioner
from raytrain.spec import JobSpec, JobState, JobStatus, PlanSummary, ServiceConfig
from raytrain.spec.files import catalog_for
from raytrain.testing.jobs import OFFER, gpt_1b_job, job

SPOT_ID = "local/here/cpu-1"


def service(tmp_path: Path, rate: float = 2.0) -> tuple[Provisioner, ServiceConfig]:
    offers = tmp_path / "offers.yaml"
    offers.write_text(yaml.safe_dump({"version": "test", "offers": [
        {**OFFER, "spot_interruptions_per_hour": rate, "on_demand_usd_per_hour": 0.5}]}))
    config = ServiceConfig(
        state_dir=str(tmp_path / "state"), offers_file=str(offers),
        node_types={"cpu-spot": {"offer": SPOT_ID, "market": "spot", "max_nodes": 1},
                    "cpu-on-demand": {"offer": SPOT_ID, "market": "on-demand",
                                      "max_nodes": 1}})
    return Provisioner(config, request=lambda job_id, bundles: None), config


def test_capacity_found_missing_is_tried_again_after_the_retry_time(tmp_path: Path) -> None:
    """Spot capacity missing: the job moves to on-demand and spot is set aside, but only for
    capacity_retry_s; after that a review may take spot again. Without the expiry a market
    found empty once stays excluded for the job's whole life (the test fails)."""
    provisioner, config = service(tmp_path, rate=0.1)
    spec = JobSpec.model_validate(job(steps=3_000_000))  # hours of work
    policy = provisioner.policy_for(spec)
    engine = CapacityEngine(policy, catalog_for(config).offers, job_throughput(spec))
    goal = job_goal(spec)
    assert engine.on(EngineEvent.SUBMIT, goal, now=0.0).option.market == "spot"
    moved = engine.on(EngineEvent.CAPACITY_MISSING, goal, now=700.0)
    assert (moved.action, moved.option.market) == ("switch", "on-demand")
    soon = engine.on(EngineEvent.PROGRESS, goal, now=700.0 + policy.capacity_retry_s / 2)
    assert soon.option.market == "on-demand"
    later = engine.on(EngineEvent.PROGRESS, goal, now=700.0 + policy.capacity_retry_s + 1)
    assert (later.action, later.option.market) == ("switch", "spot"), later.reason


def test_missing_capacity_is_waited_for_while_a_deadline_leaves_time_in_hand(
        tmp_path: Path) -> None:
    """With a deadline far enough that even the fastest option could start much later, the
    engine (and so the live service) keeps waiting for the spot capacity it chose; once the
    time in hand is gone, it drops that capacity for the job and moves."""
    provisioner, config = service(tmp_path)
    base = JobSpec.model_validate(job(steps=100_000))
    policy, offers = provisioner.policy_for(base), catalog_for(config).offers
    every = options(job_goal(base), offers, job_throughput(base), policy)
    fastest_s = min(o.expected_s for o in every)
    spot = next(o for o in every if o.market == "spot")
    in_hand_s = fastest_s * (1 + policy.deadline_margin) + policy.fallback_slack_s + \
        spot.reserve_s + policy.capacity_wait_s  # the deadline past which the job waits
    for deadline_s, action, market in ((in_hand_s + 1800 + 700, "stay", "spot"),
                                       (in_hand_s - 600 + 700, "switch", "on-demand")):
        spec = JobSpec.model_validate({**base.model_dump(mode="json"),
                                       "capacity": {"deadline_hours": deadline_s / 3600}})
        status = JobStatus.model_validate({"id": f"j{action}", "state": "PENDING",
                                           "spec": spec.model_dump(mode="json"),
                                           "created_at": 0.0})
        engine = CapacityEngine(policy, offers, job_throughput(spec))
        assert engine.on(EngineEvent.SUBMIT, job_goal(spec), 0.0).option.market == "spot"
        decision = engine.on(EngineEvent.CAPACITY_MISSING, job_goal(spec, 0, 700.0), 700.0)
        assert (decision.action, decision.option.market) == (action, market), decision.reason
        provisioner.place(status, 0.0)
        placement, decided = provisioner.capacity_missing(status, 700.0)
        assert decided.decision.action == action and placement.option.market == market
        assert ((SPOT_ID, "spot") in placement.missing) == (action == "switch")


def test_a_node_ready_time_counts_a_wait_for_capacity_only_up_to_capacity_wait_s(
        tmp_path: Path) -> None:
    """Nodes that came hours after they were asked for (the market had none, and a deadline
    left time to wait) are a capacity wait, which the capacity-missing rule prices; the
    node-ready time the policy prices every later preemption with takes at most
    capacity_wait_s of it. Counted whole, one long wait made spot look unusable for the rest
    of the job (the replay of the g4dn trace paid on-demand for it). The market is part of
    the key: an on-demand start never waits for spot capacity."""
    provisioner, _ = service(tmp_path)
    spec = JobSpec.model_validate(job(steps=100_000))
    status = JobStatus.model_validate({"id": "j", "state": "PENDING",
                                       "spec": spec.model_dump(mode="json"), "created_at": 0.0})
    placement, _ = provisioner.place(status, 10.0)
    assert placement is not None and placement.option.market == "spot"
    provisioner.nodes_up("j", 10.0 + 3 * 3600.0)
    wait_s = provisioner.policy_for(spec).capacity_wait_s
    assert provisioner.ready == {f"{SPOT_ID}@spot": (1, wait_s)}
    assert provisioner.costs_for(status).ready_for(SPOT_ID, "on-demand") == \
        provisioner.policy_for(spec).ready_s


def test_capacity_bought_is_planned_again_only_when_it_differs_from_the_plan(
        tmp_path: Path) -> None:
    """A job's stored plan is the layout on the capacity it was planned for; the provisioner
    plans again (once, through the same function) only when what it buys differs: here a job
    naming no accelerator, placed on H100s. A job that named H100s keeps its stored plan.
    Planning on every placement (as it did) makes the first count 1."""
    offers = tmp_path / "offers.yaml"
    offers.write_text(yaml.safe_dump({"version": "test", "offers": [{
        "provider": "test", "region": "r", "instance_type": "h8", "gpu_kind": "h100-sxm",
        "gpus_per_node": 8, "intra_link": "nvlink4", "network_gbps": 3200, "rdma": True,
        "on_demand_usd_per_hour": 20.0, "spot_usd_per_hour": 10.0,
        "spot_interruptions_per_hour": 0.01}]}))
    config = ServiceConfig(state_dir=str(tmp_path / "state"), offers_file=str(offers),
                           node_types={"h8": {"offer": "test/r/h8", "market": "spot",
                                              "max_nodes": 2}})
    calls: list[JobSpec] = []

    def counting(spec: JobSpec, **kwargs: Any) -> PlanSummary:
        calls.append(spec)
        return plan_summary(spec, **kwargs)

    provisioner = Provisioner(config, request=lambda job_id, bundles: None, planner=counting)
    for accelerator, replans in (("h100-sxm", 0), (None, 1)):
        spec = JobSpec.model_validate(gpt_1b_job(accelerator))
        status = JobStatus(id=f"j-{accelerator}", state=JobState.PENDING, spec=spec,
                           plan=plan_summary(spec), created_at=0.0)
        calls.clear()
        placement, _ = provisioner.place(status, 0.0)
        assert placement is not None and len(calls) == replans, accelerator
        assert placement.spec.resources.accelerator == "h100-sxm"
        if replans == 0:
            assert placement.plan == status.plan
