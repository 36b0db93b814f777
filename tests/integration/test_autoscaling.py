"""The real Ray autoscaler buys exactly the node type the policy chose for a job, as a pod from
a local fake of RunPod's API through raytrain's RunPod node provider; the job trains there and
the pod is terminated after it ends.

And preemptions: an interruption notice from the node's metadata service (as AWS gives),
then an interruptible pod RunPod takes back with no notice, then a move to a much cheaper
offer at a checkpoint; the job resumes on a replacement each time and ends with the loss an
uninterrupted run has. Five preemptions of both kinds in one job are
tests/unit/test_preemptions.py's, on the same job manager and training loop in one process:
here each worker-group start costs tens of seconds.

The fake cluster is a second Ray cluster on this host (tests/fake_cluster.py), started and
stopped by this module; the service runs on it through `raytrain serve --detach`, and the
tests talk to it only over HTTP (and a probe process that lists the cluster's nodes).
"""

from __future__ import annotations

import functools
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from raytrain.client import Client
from raytrain.spec import JobSpec, JobState
from tests.fake_cluster import FakeCluster, started_fake_cluster
from tests.integration.conftest import wait_for
from tests.integration.test_service import job_spec
from tests.unit.test_training import run_single

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[FakeCluster]:
    # Nodes of one worker each, and room for three spot nodes: a job of two workers spans
    # two nodes as two replica groups, and a third is bought when one of them is noticed.
    with started_fake_cluster(max_spot_nodes=3, workers_per_node=1) as cluster:
        yield cluster


def one_worker(document: dict) -> dict:
    """The job on one node (a rigid job: one replica group)."""
    return {**document, "resources": {**document["resources"], "num_workers": 1}}


@functools.lru_cache(maxsize=None)
def _reference_final_loss(steps: int) -> float:
    """The job of `job_spec(steps)` uninterrupted, in one process (every layout matches it to
    1e-5; the checkpoint interval does not change the losses)."""
    one = JobSpec.model_validate({**job_spec(steps=steps, checkpoint_every=steps),
                                  "resources": {"num_workers": 1}})
    with tempfile.TemporaryDirectory() as root:
        sink = run_single(one, Path(root))
    assert sink.result is not None
    return sink.result["final_loss"]


def _wait_step(client: Client, job_id: str, step: int) -> None:
    wait_for(lambda: (s := client.get(job_id)).progress.step >= step or s.state.is_terminal,
             300, f"step {step}")


def test_the_chosen_pod_is_bought_a_notice_survived_then_a_move_and_all_let_go(
    fake_cluster: FakeCluster,
) -> None:
    """The autoscaler buys exactly the node type the policy chose, as one interruptible pod
    bought through RunPod's API. Then a notice: the job (one worker, so one replica group:
    a rigid job) checkpoints at once (no step lost) and stops; RunPod then takes the pod
    back. A replacement comes and the failure budget is never touched. Then on-demand
    becomes far cheaper than spot: the policy moves the job there at a checkpoint taken for
    it (neither a preemption nor a restart). It ends with the loss of an uninterrupted run,
    and the idle pod is terminated through RunPod's API. (A rigid job's loss without a
    notice, and five of both kinds, run on the same job manager, policy and training loop in
    tests/unit/test_preemptions.py; a loss on this cluster in the replica groups' test.)"""
    client = Client(fake_cluster.url, token=fake_cluster.token)
    # Each fault takes 50-200 steps of the job's progress here, the more the faster this
    # machine trains (a fault's handling takes seconds however fast the steps are).
    steps = 800
    # The uninterrupted run's loss (about 30 s of one process), while the cluster starts the job.
    reference = ThreadPoolExecutor(1).submit(_reference_final_loss, steps)
    assert fake_cluster.worker_node_types() == []  # nothing bought yet
    job = client.submit(one_worker(job_spec(steps=steps, checkpoint_every=50)))
    # The policy picks spot (0.03 $/h against 0.10 on demand).
    running = wait_for(lambda: (s := client.get(job.id)).state in (
        JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED) and s, 300, "the job to start")
    assert running.error is None, running.error
    resources = running.resources
    assert (resources.node_type, resources.market, resources.offer) == (
        "cpu-spot", "spot", "local/here/cpu-2")
    assert resources.nodes == 1 and resources.usd_per_hour == pytest.approx(0.03)
    first = running.decisions[0]
    assert (first.event, first.action, first.market) == ("submit", "start", "spot")
    assert "1 x cpu-2 spot" in first.reason
    # Exactly the chosen node type came up; the worker can only run there (it asks for its
    # cpu-spot resource).
    assert fake_cluster.worker_node_types() == ["cpu-spot"]
    [pod] = fake_cluster.runpod.running()
    assert fake_cluster.runpod.pods[pod["id"]]["interruptible"]
    assert pod["name"].startswith("ray-raytrain-local-cpu-spot-")
    offers = client.offers(job_id=job.id)
    assert offers.ranking[0].market == "spot" and offers.decision
    assert offers.source == "file" and offers.offers[0].id == "local/here/cpu-2"
    for fault in range(2):
        status = client.get(job.id)  # past its last report: training again after a resume
        _wait_step(client, job.id, status.progress.step + 25)
        wait_for(lambda: client.get(job.id).state == JobState.RUNNING, 300, "training")
        [node] = fake_cluster.worker_nodes()
        assert client.get(job.id).progress.step < steps - 150, f"too near the end: {fault + 1}"
        if fault == 1:
            break
        fake_cluster.metadata.interrupt()  # AWS: this instance goes in two minutes
        noticed = wait_for(lambda: len((s := client.get(job.id)).preemption_log) == 1 and s,
                           60, "the checkpoint on the notice")
        fake_cluster.metadata.clear()  # the replacement hears no notice
        record = noticed.preemption_log[-1]
        assert record.lost_steps == 0 and record.checkpoint_step == record.reached_step
        assert noticed.checkpoint.step == record.checkpoint_step
        assert record.notice_to_checkpoint_s is not None and record.notice_to_checkpoint_s < 60
        assert noticed.state == JobState.RECOVERING
        fake_cluster.take_node(node)
    assert client.get(job.id).resources.node_type == "cpu-spot"
    original = fake_cluster.offers.read_text()
    try:  # on-demand becomes far cheaper than spot: the service reads the offers again
        cheaper = yaml.safe_load(original)
        cheaper["offers"][0]["on_demand_usd_per_hour"] = 0.0001
        fake_cluster.offers.write_text(yaml.safe_dump(cheaper))
        final = job.wait()
    finally:
        fake_cluster.offers.write_text(original)
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.preemptions == 1 and final.restarts == 0  # the failure budget is untouched
    log = final.preemption_log
    assert [r.notice for r in log] == [True] and final.lost_steps == 0
    assert all(r.after is not None and r.capacity_to_first_step_s for r in log)
    assert final.down_s > 0
    # Reviews in between may record a stay at a checkpoint interval that moved (the rate
    # seen, the checkpoint time measured); none moved the job.
    reviews = [d for d in final.decisions if d.event == "progress"]
    assert all(d.action == "stay" and d.checkpoint_interval_s for d in reviews), reviews
    assert [d.event for d in final.decisions if d.event != "progress"] == \
        ["submit", "preemption", "prices"]
    move = final.decisions[-1]
    assert move.action == "switch" and move.market == "on-demand" and "saves" in move.reason
    assert final.resources.node_type == "cpu-on-demand" and final.resources.market == "on-demand"
    assert final.result.final_loss == pytest.approx(reference.result(), abs=1e-5)
    assert final.cost_usd > 0
    # The request is withdrawn; the idle pod is terminated through RunPod's API
    # (idle_timeout_minutes: 0.1).
    wait_for(lambda: fake_cluster.worker_node_types() == [] and not fake_cluster.runpod.pods,
             90, "the last pod to be terminated")
    print(f"\nRunPod (fake API): decision to first step on a new pod "
          f"{running.started_at - first.time:.1f} s; capacity to first step after each "
          f"preemption {[round(r.capacity_to_first_step_s, 1) for r in log]} s; down "
          f"{[round(r.down_s, 1) for r in log]} s")


def test_a_spot_job_checkpoints_at_the_interval_the_engine_returned(
    fake_cluster: FakeCluster,
) -> None:
    """One spot job on a pod bought through RunPod's API, believed first rarely preempted,
    then often: the service's offers are changed while it trains to a rate a thousand times
    higher. Believed rare, the engine's interval is longer than the whole run, and the job
    does not checkpoint; believed often, the engine returns an interval of a second or so, the
    job's decisions record it, and the job checkpoints at it."""
    client = Client(fake_cluster.url, token=fake_cluster.token)
    steps = 1500  # about 17 ms each here: some 20 s after the change, more on a busy host
    document = one_worker(job_spec(steps=steps, checkpoint_every=steps, name="interval"))
    document["capacity"] = {"policy": "spot-test"}  # spot only, with this tiny job's costs
    original = fake_cluster.offers.read_text()
    try:
        job = client.submit(document)
        _wait_step(client, job.id, 100)
        rarely = client.get(job.id)
        assert rarely.state == JobState.RUNNING, rarely.error
        believed_rare = rarely.decisions[-1].checkpoint_interval_s
        assert believed_rare is not None and believed_rare > 30, rarely.decisions
        often = yaml.safe_load(original)
        often["offers"][0]["spot_interruptions_per_hour"] *= 1000  # 0.05 -> 50 per node-hour
        fake_cluster.offers.write_text(yaml.safe_dump(often))

        def reviewed() -> bool:
            status = client.get(job.id)
            return status.state.is_terminal or any(d.event == "prices"
                                                   for d in status.decisions)

        wait_for(reviewed, 120, "the service to review the job at the new prices")
        final = job.wait()
    finally:
        fake_cluster.offers.write_text(original)
    assert final.state == JobState.SUCCEEDED, final.error
    [changed, *_] = [d for d in final.decisions if d.event == "prices"]
    assert changed.action == "stay" and changed.market == "spot"
    assert changed.checkpoint_interval_s is not None and changed.checkpoint_interval_s < 5
    intervals = [d.checkpoint_interval_s for d in final.decisions if d.time >= changed.time]
    # When each save began: its event comes once it is committed, `durable_s` later.
    saved = [e.time - (e.data.get("durable_s") or 0.0) for e in client.events(job.id)
             if e.type == "checkpoint" and e.data["step"] < steps]
    assert saved and min(saved) >= changed.time  # none while it was believed rare
    assert final.finished_at - changed.time > 3 * max(intervals), "too short to see it"
    assert len(saved) >= 3, (saved, intervals)
    # Never sooner than the interval after the previous checkpoint, nor much later (a loss
    # sync, a report's way to the service, a busy machine).
    gaps = [b - a for a, b in zip(saved, saved[1:])]
    assert all(0.9 * min(intervals) <= gap <= max(intervals) + 5 for gap in gaps), \
        (intervals, gaps)
    print(f"\nspot interval: believed rare {believed_rare:.0f} s, no checkpoint; believed often "
          f"{intervals} s, {len(saved)} checkpoints, gaps {[round(g, 2) for g in gaps]} s")


def test_replica_groups_outlive_a_notice_and_a_loss_and_the_job_trains_as_if_neither_happened(
    fake_cluster: FakeCluster,
) -> None:
    """A job of two workers on two interruptible pods: two replica groups. A notice for the
    node of one: it leaves at a step boundary (nothing redone) and its replacement is bought
    at once; the other trains on alone; then the pod is taken. The replacement heals from the
    live group and joins. Then the other group's pod is taken with no notice: at most the
    step in flight is redone, and a replacement is bought, heals and joins. The job never
    stops, never restarts from a checkpoint, and ends with the loss of an uninterrupted run."""
    client = Client(fake_cluster.url, token=fake_cluster.token)
    steps = 1500
    reference = ThreadPoolExecutor(1).submit(_reference_final_loss, steps)
    job = client.submit(job_spec(steps=steps, checkpoint_every=steps, name="elastic"))

    def groups(state: str = "training") -> list[str] | None:
        status = client.get(job.id)
        assert not status.state.is_terminal, status.error
        up = [g for g in status.groups if g.state == state and g.nodes]
        return [g.nodes[0] for g in up] if len(status.groups) == 2 and len(up) == 2 else None

    first = wait_for(groups, 300, "both replica groups training, each on its pod")
    _wait_step(client, job.id, 50)
    fake_cluster.metadata.interrupt(node=first[1])  # the cloud: this node goes in 2 minutes
    left = wait_for(lambda: (s := client.get(job.id)).preemption_log and s, 120,
                    "the noticed group to leave")
    fake_cluster.take_node(first[1])  # ... and then it is gone
    assert left.state == JobState.RUNNING and left.restarts == 0
    second = wait_for(lambda: (nodes := groups()) and nodes[1] not in first and nodes, 300,
                      "the replacement to heal and join")
    _wait_step(client, job.id, client.get(job.id).progress.step + 30)
    fake_cluster.take_node(second[0])  # the other group's pod, with no notice
    final = job.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.restarts == 0 and final.preemptions == 2
    noticed, lost = final.preemption_log
    assert (noticed.group, noticed.notice, noticed.lost_steps) == (1, True, 0)
    assert (lost.group, lost.notice) == (0, False) and lost.lost_steps <= 1
    assert final.lost_steps == lost.lost_steps
    assert all(r.survivors == 1 and r.replaced_after_s for r in final.preemption_log)
    assert final.result.final_loss == pytest.approx(reference.result(), abs=1e-5)
    print(f"\nreplica groups: survivors' stall on the notice {noticed.stall_s:.1f} s, on the "
          f"loss {lost.stall_s:.1f} s (steps redone {lost.lost_steps}); replaced after "
          f"{noticed.replaced_after_s:.0f} s and {lost.replaced_after_s:.0f} s; joins "
          f"stalled {final.costs.group_stall_s.measured_s:.2f} s on average")
