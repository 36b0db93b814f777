"""The capacity engine the live service and the simulator share: fed the same events, the
live provisioner decides exactly what the engine decides as the simulator drives it."""

from __future__ import annotations

from pathlib import Path

import yaml

from raytrain.core.autoscale import options
from raytrain.core.engine import CapacityEngine
from raytrain.core.throughput import job_goal, job_throughput
from raytrain.serve.provisioning import Provisioner, catalog_for
from raytrain.spec import JobSpec, JobStatus, ServiceConfig
from tests.unit.test_preemptions import OFFER, job

SPOT_ID = "local/here/cpu-1"


def service(tmp_path: Path) -> tuple[Provisioner, ServiceConfig]:
    offers = tmp_path / "offers.yaml"
    offers.write_text(yaml.safe_dump({"version": "test", "offers": [
        {**OFFER, "spot_interruptions_per_hour": 2.0, "on_demand_usd_per_hour": 0.5}]}))
    config = ServiceConfig(
        state_dir=str(tmp_path / "state"), offers_file=str(offers),
        node_types={"cpu-spot": {"offer": SPOT_ID, "market": "spot", "max_nodes": 1},
                    "cpu-on-demand": {"offer": SPOT_ID, "market": "on-demand",
                                      "max_nodes": 1}})
    return Provisioner(config, request=lambda job_id, bundles: None), config


def test_the_live_provisioner_decides_as_the_simulators_engine(tmp_path: Path) -> None:
    provisioner, config = service(tmp_path)
    spec = JobSpec.model_validate(job(steps=100_000))  # no deadline: nothing to wait for
    status = JobStatus.model_validate({"id": "j1", "state": "PENDING",
                                       "spec": spec.model_dump(mode="json"),
                                       "created_at": 0.0})
    engine = CapacityEngine(provisioner.policy_for(spec), catalog_for(config).offers,
                            job_throughput(spec))
    # Submit; two preemptions (each counted first, as the tally does for the service);
    # the capacity missing; a review later on. Time passes between them; no step is done.
    events = [("submit", 0.0, 0, 0.0), ("preemption", 600.0, 1, 0.1),
              ("preemption", 900.0, 1, 0.1), ("capacity-missing", 1500.0, 0, 0.0),
              ("progress", 4 * 3600.0, 0, 0.0)]
    live, simulated = [], []
    for event, now, preempted, node_hours in events:
        if preempted or node_hours:
            engine.exposed(SPOT_ID, preempted, node_hours)
            count, hours = provisioner.history.get(SPOT_ID, (0, 0.0))
            provisioner.history[SPOT_ID] = (count + preempted, hours + node_hours)
            status = status.model_copy(update={"preemptions": status.preemptions + preempted})
        goal = job_goal(spec, 0, now, status.cost_usd)
        decision = engine.on(event, goal)
        simulated.append((decision.action, decision.option and decision.option.key,
                          decision.option and decision.option.checkpoint_interval_s))
        if event == "submit":
            _, decided = provisioner.place(status, now)
        elif event == "preemption":
            _, decided = provisioner.preempted(status, now)
        elif event == "capacity-missing":
            _, decided = provisioner.capacity_missing(status, now)
        else:
            _, decided = provisioner.review(status, now, event)
        record = decided.decision if decided is not None else None
        live.append(None if record is None else (record.action, record.offer and (
            record.offer, record.market, record.nodes), record.checkpoint_interval_s))
    # The live service records what changes capacity or its checkpoint interval.
    assert [d for d in live if d is not None] == [
        d for d, shown in zip(simulated, live) if shown is not None]
    assert [d[0] for d in simulated] == ["start", "stay", "stay", "switch", "stay"]
    assert live[:4] == simulated[:4] and live[4] is None  # the review changed nothing
    intervals = [d[2] for d in simulated[:3]]
    assert intervals == sorted(intervals, reverse=True)  # preemptions seen: checkpoint sooner
    assert simulated[3][1] == (SPOT_ID, "on-demand", 1)  # spot missing: on demand


def test_missing_capacity_is_waited_for_while_a_deadline_leaves_time_in_hand(
        tmp_path: Path) -> None:
    """With a deadline far enough that even the fastest option could start much later, the
    engine (and so the live service) keeps waiting for the spot capacity it chose; once the
    time in hand is gone, it drops that capacity for the job and moves."""
    provisioner, config = service(tmp_path)
    base = JobSpec.model_validate(job(steps=100_000))
    policy, offers = provisioner.policy_for(base), catalog_for(config).offers
    fastest_s = min(o.expected_s for o in options(job_goal(base), offers, job_throughput(base),
                                                  policy))
    in_hand_s = fastest_s * (1 + policy.deadline_margin) + policy.fallback_slack_s + \
        policy.capacity_wait_s  # the deadline (from the check) past which the job waits
    for deadline_s, action, market in ((in_hand_s + 1800 + 700, "stay", "spot"),
                                       (in_hand_s - 600 + 700, "switch", "on-demand")):
        spec = JobSpec.model_validate({**base.model_dump(mode="json"),
                                       "capacity": {"deadline_hours": deadline_s / 3600}})
        status = JobStatus.model_validate({"id": f"j{action}", "state": "PENDING",
                                           "spec": spec.model_dump(mode="json"),
                                           "created_at": 0.0})
        engine = CapacityEngine(policy, offers, job_throughput(spec))
        assert engine.on("submit", job_goal(spec)).option.market == "spot"
        decision = engine.on("capacity-missing", job_goal(spec, 0, 700.0))
        assert (decision.action, decision.option.market) == (action, market), decision.reason
        provisioner.place(status, 0.0)
        placement, decided = provisioner.capacity_missing(status, 700.0)
        assert decided.decision.action == action and placement.option.market == market
        assert ((SPOT_ID, "spot") in placement.unavailable) == (action == "switch")
