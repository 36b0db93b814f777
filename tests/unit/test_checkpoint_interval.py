"""A live job checkpoints at the interval the policy returned for its capacity, in one process:
the real job manager, scheduler, lifecycle, policy and training loop (tests/fake_ray's
TrainingRay runs the loop in a thread and buys the nodes requested). A spot offer the policy
believes often preempted gets a short interval and checkpoints often; one it believes rarely
preempted, a long one, and checkpoints only at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from raytrain.spec import JobState, ServiceConfig
from tests.fake_ray import TrainingRay
from tests.unit.support import SPOT_TEST_POLICY
from tests.unit.test_preemptions import OFFER, job


def run_spot_job(tmp_path: Path, interruptions_per_hour: float, steps: int
                 ) -> tuple[Any, list[float]]:
    """The job's final status, and when its checkpoints before the last step's began."""
    tmp_path.mkdir()
    offers, policies = tmp_path / "offers.yaml", tmp_path / "policies"
    offers.write_text(yaml.safe_dump({"version": "test", "offers": [
        {**OFFER, "spot_interruptions_per_hour": interruptions_per_hour}]}))
    policies.mkdir()
    (policies / "spot-test.yaml").write_text(yaml.safe_dump(SPOT_TEST_POLICY))
    config = ServiceConfig(
        state_dir=str(tmp_path / "state"), offers_file=str(offers), policy_dir=str(policies),
        default_policy="spot-test", scheduler_interval_s=0.05,
        node_types={"cpu-spot": {"offer": "local/here/cpu-1", "market": "spot",
                                 "max_nodes": 1}})
    document = job(steps)
    document["training"]["checkpoint_every_steps"] = steps  # only the policy's, and the end
    cluster = TrainingRay(cpus=1)
    job_id = cluster.train_to_the_end(config, document)
    manager = cluster.manager
    events = manager.wait_events(job_id, 0, 0.0) or []
    # When each save began: its event comes once it is committed, `durable_s` later.
    saved = [e["time"] - (e["data"]["durable_s"] or 0.0) for e in events
             if e["type"] == "checkpoint" and e["data"]["step"] < steps]
    return manager.records[job_id].status, saved


def test_the_policys_interval_decides_when_a_live_spot_job_checkpoints(tmp_path: Path) -> None:
    often, often_saved = run_spot_job(tmp_path / "often", 600.0, steps=800)
    rarely, rarely_saved = run_spot_job(tmp_path / "rarely", 0.002, steps=200)
    for status in (often, rarely):
        assert status.state == JobState.SUCCEEDED, status.error
        assert [d.market for d in status.decisions] == ["spot"]
    interval = often.decisions[0].checkpoint_interval_s  # the engine's, kept with the job
    assert interval is not None and interval < 3.0
    assert rarely.decisions[0].checkpoint_interval_s > 300  # past the whole run
    trained_s = often.finished_at - often.started_at
    assert trained_s > 3 * interval, "the run was too short to see the interval"
    assert len(often_saved) >= 2 and rarely_saved == []
    # Never sooner than the interval after the previous checkpoint (the first counts from the
    # run's start), and no later than one loss sync (0.5 s) and a step or two after it.
    gaps = [b - a for a, b in zip(often_saved, often_saved[1:])]
    assert all(interval * 0.95 <= gap <= interval + 1.5 for gap in gaps), (interval, gaps)
