"""The real Ray autoscaler, with Ray's fake multi-node provider, buys exactly the node type the
policy chose for a job; the job trains there and the node goes away after it ends.

And preemptions: an interruption notice from the nodes' metadata service, a node taken with
no notice, six of them in one run; the job resumes on the replacement node each time and
ends with the loss an uninterrupted run has.

The fake cluster is a second Ray cluster on this host (tests/fake_cluster.py), started and
stopped by this module; the service runs on it through `raytrain serve --detach`, and the
tests talk to it only over HTTP (and a probe process that lists the cluster's nodes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import yaml

from raytrain.client import Client
from raytrain.spec import JobSpec, JobState
from raytrain.train.loop import WorkerInfo, train
from tests.fake_cluster import FakeCluster, started_fake_cluster
from tests.integration.conftest import wait_for
from tests.integration.test_service import job_spec
from tests.unit.support import RecordingSink

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[FakeCluster]:
    with started_fake_cluster() as cluster:
        yield cluster


def test_the_autoscaler_launches_the_chosen_node_type_and_lets_it_go(
    fake_cluster: FakeCluster,
) -> None:
    client = Client(fake_cluster.url)
    spec = job_spec(steps=60, checkpoint_every=30)
    assert fake_cluster.worker_node_types() == []  # nothing bought yet
    job = client.submit(spec)
    # The policy picks spot (0.03 $/h against 0.10 on demand) for a job this short.
    running = wait_for(lambda: (s := client.get(job.id)).state in (
        JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED) and s, 150, "the job to start")
    assert running.error is None, running.error
    resources = running.resources
    assert (resources.node_type, resources.market, resources.offer) == (
        "cpu-spot", "spot", "local/here/cpu-2")
    assert resources.nodes == 1 and resources.hourly_usd == pytest.approx(0.03)
    first = running.decisions[0]
    assert (first.event, first.action, first.market) == ("submit", "start", "spot")
    assert "1 x cpu-2 spot" in first.reason
    # Exactly the chosen node type came up; the workers can only run there (they each ask
    # for half of its cpu-spot resource).
    assert fake_cluster.worker_node_types() == ["cpu-spot"]
    final = job.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.result is not None and final.result.final_loss < final.result.first_loss
    assert final.cost_usd > 0  # 0.03 $/h for the time it held the node
    # The request is withdrawn; the idle node goes (idle_timeout_minutes: 0.1).
    wait_for(lambda: fake_cluster.worker_node_types() == [], 90, "the spot node to go away")
    offers = client.offers(job_id=job.id)
    assert offers.ranking[0].market == "spot" and offers.decision
    assert offers.source == "file" and offers.offers[0].id == "local/here/cpu-2"


def _reference_final_loss(spec: dict, root: Path) -> float:
    """The same job uninterrupted, in one process (every layout matches it to 1e-5)."""
    one = JobSpec.model_validate({**spec, "resources": {"num_workers": 1}})
    sink = RecordingSink()
    train(one, WorkerInfo.single_process(), sink, root, progress_interval_s=0.0)
    assert sink.result is not None
    return sink.result["final_loss"]


def _wait_step(client: Client, job_id: str, step: int) -> None:
    wait_for(lambda: (s := client.get(job_id)).progress.step >= step or s.state.is_terminal,
             150, f"step {step}")


def test_a_notice_checkpoints_at_once_and_the_job_finishes_on_a_replacement_node(
    fake_cluster: FakeCluster, tmp_path: Path
) -> None:
    client = Client(fake_cluster.url)
    spec = job_spec(steps=300, checkpoint_every=200)
    job = client.submit(spec)
    _wait_step(client, job.id, 40)
    [(node, kind)] = fake_cluster.worker_nodes().items()
    assert kind == "cpu-spot"
    fake_cluster.metadata.interrupt()  # AWS: this instance goes in two minutes
    recovering = wait_for(lambda: (s := client.get(job.id)).preemption_log and s, 60,
                          "the job to checkpoint on the notice")
    fake_cluster.metadata.clear()  # the replacement hears no notice
    record = recovering.preemption_log[0]
    assert record.notice and record.lost_steps == 0
    assert record.checkpoint_step == record.reached_step >= 40
    assert recovering.checkpoint.step == record.checkpoint_step
    assert record.notice_to_checkpoint_s is not None and record.notice_to_checkpoint_s < 60
    assert recovering.state == JobState.RECOVERING and recovering.preemptions == 1
    fake_cluster.take_node(node)  # the instance is taken
    final = job.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.restarts == 0 and final.preemptions == 1  # the failure budget is untouched
    done = final.preemption_log[0]
    assert done.after is not None and done.capacity_to_first_step_s is not None
    assert node not in fake_cluster.worker_nodes()  # it ran on the replacement
    assert [d.event for d in final.decisions] == ["submit", "preemption"]
    assert final.result.final_loss == pytest.approx(
        _reference_final_loss(spec, tmp_path / "reference"), abs=1e-5)


def test_a_node_lost_without_notice_costs_at_most_one_checkpoint_interval(
    fake_cluster: FakeCluster,
) -> None:
    client = Client(fake_cluster.url)
    job = client.submit(job_spec(steps=200, checkpoint_every=40))
    _wait_step(client, job.id, 60)  # past the step-40 checkpoint
    [(node, _)] = fake_cluster.worker_nodes().items()
    fake_cluster.take_node(node)
    final = job.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.restarts == 0 and final.preemptions == 1
    record = final.preemption_log[0]
    assert not record.notice and record.checkpoint_step is not None
    assert 0 <= record.lost_steps <= 40 and record.reached_step >= 60


def test_six_preemptions_of_both_kinds_and_the_job_still_ends_where_it_would_have(
    fake_cluster: FakeCluster, tmp_path: Path
) -> None:
    client = Client(fake_cluster.url)
    spec = job_spec(steps=800, checkpoint_every=50)
    job = client.submit(spec)
    for fault in range(6):
        status = client.get(job.id)
        _wait_step(client, job.id, status.progress.step + 25)
        wait_for(lambda: client.get(job.id).state == JobState.RUNNING, 150, "training")
        [node] = fake_cluster.worker_nodes()
        if fault % 2 == 0:  # a notice first, then the node goes
            fake_cluster.metadata.interrupt()
            wait_for(lambda: len(client.get(job.id).preemption_log) == fault + 1, 60,
                     "the checkpoint on the notice")
            fake_cluster.metadata.clear()
        fake_cluster.take_node(node)
    final = job.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.preemptions == 6 and final.restarts == 0
    log = final.preemption_log
    assert [r.notice for r in log] == [True, False] * 3
    assert all(r.lost_steps == 0 for r in log if r.notice)
    assert all(r.lost_steps <= 50 for r in log if not r.notice)
    assert final.lost_steps == sum(r.lost_steps for r in log)
    assert all(r.after is not None for r in log) and final.down_s > 0
    assert final.result.final_loss == pytest.approx(
        _reference_final_loss(spec, tmp_path / "reference"), abs=1e-5)


def test_a_much_cheaper_offer_moves_the_running_job_at_a_checkpoint(
    fake_cluster: FakeCluster, tmp_path: Path
) -> None:
    client = Client(fake_cluster.url)
    spec = job_spec(steps=1500, checkpoint_every=1000)
    job = client.submit(spec)
    _wait_step(client, job.id, 40)
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
    assert final.resources.node_type == "cpu-on-demand" and final.resources.market == "on-demand"
    assert final.preemptions == 0 and final.restarts == 0  # a move is neither
    [move] = [d for d in final.decisions if d.event == "prices"]
    assert move.action == "switch" and move.market == "on-demand" and "saves" in move.reason
    assert final.result.final_loss == pytest.approx(
        _reference_final_loss(spec, tmp_path / "reference"), abs=1e-5)
