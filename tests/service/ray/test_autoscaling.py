"""`ray up cluster/runpod.yaml` against a local fake of RunPod's API starts the head pod over
SSH on its mapped port, with Ray, the autoscaler and the service on it; `ray exec` and `ray
submit` reach it. The real Ray autoscaler there buys exactly the node type the policy chose
for a job, as pods through raytrain's RunPod node provider; the job trains there as two
replica groups, survives an interruption notice (as AWS gives, from the node's metadata
service) and a pod RunPod takes back with no notice, each time without stopping; the pods
are terminated after it ends, and `ray down` leaves no pod on the account.

Every Ray Train start costs tens of seconds here, so this is the one job on this cluster.
A rigid job's preemptions of both kinds and a move at a checkpoint run on the same job
manager, policy and training loop in one process (tests/pure/test_preemptions.py), as does
the policy's checkpoint interval when the offers change while a job trains
(tests/pure/test_checkpoint_interval.py).

The fake cluster is a second Ray cluster on this host (raytrain/testing/fake_cluster.py), brought up
and down by this module with Ray's own `ray up` and `ray down`; the service runs on its head
pod, and the test talks to it only over HTTP, `ray exec` and `ray submit` (and a probe
process that lists the cluster's nodes).
"""

from __future__ import annotations

import functools
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from raytrain.client import Client
from raytrain.cloud.cluster_configs import (
    check_cluster_config,
    load_cluster_config,
    node_type_bindings,
)
from raytrain.errors import NotAuthorizedError
from raytrain.spec import JobSpec, JobState
from raytrain.spec.files import snapshot
from raytrain.testing.fake_cluster import FakeCluster, started_fake_cluster
from raytrain.testing.ray_service import job_spec, reference_run, wait_for
from tests.support.tolerances import SUM_ORDER

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[FakeCluster]:
    # Nodes of one worker each, and room for three spot nodes: a job of two workers spans
    # two nodes as two replica groups, and a third is bought when one of them is noticed.
    with started_fake_cluster(max_spot_nodes=3, workers_per_node=1) as cluster:
        yield cluster


def elastic_job(steps: int) -> dict:
    """The job: two workers, one replica group on each pod; a micro-batch of 8, so that a
    group's step is one micro-batch (two while it trains alone)."""
    document = job_spec(steps=steps, checkpoint_every=steps, name="elastic")
    document["training"]["micro_batch_size"] = 8
    return document


@functools.lru_cache(maxsize=None)
def _reference_final_loss(steps: int) -> float:
    """The job uninterrupted, in one process (every layout matches it to 1e-5; the
    checkpoint interval does not change the losses)."""
    one = JobSpec.model_validate({**elastic_job(steps), "resources": {"num_workers": 1}})
    with tempfile.TemporaryDirectory() as root:
        sink = reference_run(one, Path(root))
    assert sink.result is not None
    return sink.result["final_loss"]


def _accepted(client: Client) -> bool:
    try:
        client.list()
    except NotAuthorizedError:  # not yet: the service reads its tokens within seconds,
        time.sleep(1.0)  # and checks a refused address's tokens once a second
        return False
    return True


def _pods_created(cluster: FakeCluster) -> int:
    """Pods the autoscaler has asked RunPod for so far (through its REST create)."""
    return sum(r.get("rest") == "POST /v2/pods" for r in cluster.runpod.requests)


def _wait_step(client: Client, job_id: str, step: int) -> None:
    wait_for(lambda: (s := client.get(job_id)).progress.step >= step or s.state.is_terminal,
             300, f"step {step}")


def test_replica_groups_outlive_a_notice_and_a_loss_and_the_job_trains_as_if_neither_happened(
    fake_cluster: FakeCluster,
) -> None:
    """A job of two workers: the policy picks spot, and the autoscaler buys exactly that node
    type, two pods through RunPod's REST API v2, one replica group on each. A notice
    for the node of one: it leaves at a step boundary (nothing redone) and its replacement is
    bought at once; the other trains on alone; then the pod is taken. The replacement heals
    from the live group and joins. Then the other group's pod is taken with no notice: at
    most the step in flight is redone, the survivor trains on, and its replacement heals and
    joins too (if the job lasts long enough). The job never stops, never restarts from a
    checkpoint, and ends with the loss of an uninterrupted run; then every worker pod is
    terminated through RunPod's API, and `ray down` terminates the head."""
    # The user's own token, made on the head pod over `ray exec`; `ray submit` runs a script
    # there that reads the service's health.
    made = fake_cluster.ray("exec", "raytrain token add alice --state-dir "
                            f"{fake_cluster.root / 'state'}")
    [token] = re.findall(r"^(rt_[\w-]{20,})\s*$", made, re.M)  # the one line it prints
    script = fake_cluster.root / "laptop" / "health.py"
    script.write_text("import httpx, sys\n"
                      "print('head says', httpx.get(sys.argv[1] + '/healthz').status_code)\n")
    assert "head says 200" in fake_cluster.ray("submit", str(script), fake_cluster.url)
    # What `raytrain serve --cluster-config ~/ray_bootstrap_config.yaml` reads on a RunPod head
    # (the head here takes this test's local offers instead): `ray up`'s copy of the config.
    [copied] = (fake_cluster.root / "pods").glob("*/ray_bootstrap_config.yaml")
    assert check_cluster_config(load_cluster_config(copied), snapshot()) == []
    assert set(node_type_bindings(load_cluster_config(copied), snapshot())) == {
        "cpu-spot", "cpu-on-demand"}
    client = Client(fake_cluster.url, token=token)
    wait_for(lambda: _accepted(client), 60, "the service to take alice's token")
    # Long enough for both replacements to join on most hosts (below).
    steps = 1600
    # The uninterrupted run's loss (one process), while the cluster starts the job.
    reference = ThreadPoolExecutor(1).submit(_reference_final_loss, steps)
    assert fake_cluster.worker_node_types() == []  # nothing bought yet
    job = client.submit(elastic_job(steps))

    def groups(state: str = "training") -> list[str] | None:
        status = client.get(job.id)
        assert not status.state.is_terminal, status.error
        up = [g for g in status.groups if g.state == state and g.nodes]
        return [g.nodes[0] for g in up] if len(status.groups) == 2 and len(up) == 2 else None

    # Two pods' start and two Ray Train starts: 100 s idle here, 4-5 minutes on a busy host.
    first = wait_for(groups, 600, "both replica groups training, each on its pod")
    running = client.get(job.id)
    # The policy picked spot (0.03 $/h against 0.10 on demand), and exactly that came up.
    resources = running.resources
    assert (resources.node_type, resources.market, resources.offer, resources.nodes) == (
        "cpu-spot", "spot", "local/here/cpu-2", 2)
    assert resources.usd_per_hour == pytest.approx(0.06)
    decided = running.decisions[0]
    assert (decided.event, decided.action, decided.market) == ("submit", "start", "spot")
    assert "2 x cpu-2 spot" in decided.reason
    # Only that type (a pod still booting or going may be counted beside the two).
    types = fake_cluster.worker_node_types()
    assert set(types) == {"cpu-spot"} and len(types) >= 2, types
    pods = [p for p in fake_cluster.runpod.running()
            if not p["name"].startswith("ray-raytrain-local-head-")]  # the head: on demand
    assert len(pods) >= 2 and all(p["name"].startswith("ray-raytrain-local-cpu-spot-")
                                  for p in pods), pods
    offers = client.offers(job_id=job.id)
    assert offers.ranking[0].market == "spot" and offers.decision
    assert offers.source == "file" and offers.offers[0].id == "local/here/cpu-2"

    # Both groups in one quorum before the notice, as the leader reports the groups of each
    # step. (A group noticed before any other joined it is recorded by the runner when its fit
    # ends, elastic_launcher._after_its_end; the others start from the checkpoint it left.)
    wait_for(lambda: client.get(job.id).progress.groups == 2, 300, "both groups in one quorum")
    fake_cluster.metadata.interrupt(node=first[1])  # the cloud: this node goes in 2 minutes
    left = wait_for(lambda: (s := client.get(job.id)).preemption_log and s, 120,
                    "the noticed group to leave")
    fake_cluster.take_node(first[1])  # ... and then it is gone
    assert left.state == JobState.RUNNING and left.restarts == 0
    def replaced() -> list[str] | str | None:  # the notice's replacement joined, or the end
        status = client.get(job.id)
        if status.state.is_terminal:
            return "ended"
        up = [g.nodes[0] for g in status.groups if g.state == "training" and g.nodes]
        return up if len(status.groups) == 2 and len(up) == 2 and up[1] not in first else None

    # On a busy host the survivor can train the last steps before a new pod and its fit are
    # up (a replacement took 25-46 s idle, the job's end came 100 s after its start with a
    # core kept busy): then the job ends with the one preemption, and the loss without notice
    # is not tried. tests/ranks/test_elastic_training.py heals and joins with no end in sight.
    second = wait_for(replaced, 300, "the replacement to heal and join, or the job to end")
    ended_early = second == "ended"
    if not ended_early:
        assert isinstance(second, list)
        _wait_step(client, job.id, client.get(job.id).progress.step + 30)
        bought_before_loss = _pods_created(fake_cluster)
        fake_cluster.take_node(second[0])  # the other group's pod, with no notice

        def rejoined() -> bool:  # the loss's replacement trains beside the survivor, or the end
            status = client.get(job.id)
            if status.state.is_terminal:
                return True
            up = [g.nodes[0] for g in status.groups if g.state == "training" and g.nodes]
            return len(up) == 2 and second[0] not in up

        wait_for(rejoined, 300, "the loss's replacement to join, or the job to end")
    final = job.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.restarts == 0 and final.preemptions == (1 if ended_early else 2)
    noticed, *later = final.preemption_log
    assert (noticed.group, noticed.notice, noticed.lost_steps) == (1, True, 0)
    assert noticed.survivors == 1
    lost = None
    if not ended_early:
        [lost] = later
        assert (lost.group, lost.notice) == (0, False) and lost.lost_steps <= 1
        assert final.lost_steps == lost.lost_steps
        assert lost.survivors == 1 and noticed.replaced_after_s
        # The loss's replacement is bought at once (the survivors report the loss within
        # seconds) and joins too, unless the job ends first (the end came 15-38 s after the
        # loss, a replacement took 25-46 s).
        assert lost.replaced_after_s or _pods_created(fake_cluster) > bought_before_loss, lost
    assert final.result.final_loss == pytest.approx(reference.result(), abs=SUM_ORDER)
    assert final.cost_usd > 0
    # The requests are withdrawn; the idle pods are terminated through RunPod's API
    # (idle_timeout_minutes: 0.1). A replacement still starting when the job ended left its
    # fit's placement group behind, which kept its pod bought for good (this wait timed out),
    # until the end of a run of replica groups removed the groups no run holds
    # (lifecycle StopRunner.reclaim). Its Ray Train controller's own node request stayed
    # with the autoscaling coordinator until it expired (180 s), keeping a pod bought, until
    # the runner withdrew the requests of the fits it left starting (elastic_launcher): the
    # ceiling is under that expiry (the pods go in seconds; idle_timeout is 6 s).
    wait_for(lambda: fake_cluster.worker_node_types() == [] and [
        p["name"].rsplit("-", 1)[0] for p in fake_cluster.runpod.pods.values()] == [
        "ray-raytrain-local-head"], 150, "the last worker pod to be terminated")
    fake_cluster.down()
    assert not fake_cluster.runpod.pods
    ended = final.finished_at - (lost.time if lost else noticed.time)
    print(f"\nreplica groups: decision to first step on new pods "
          f"{running.started_at - decided.time:.1f} s; survivors' stall on the notice "
          f"{_s(noticed.stall_s)}, replaced after {_s(noticed.replaced_after_s)}; "
          + (f"the job ended {ended:.1f} s after the notice, before its replacement joined"
             if lost is None else
             f"on the loss {_s(lost.stall_s)} (steps redone {lost.lost_steps}), replaced "
             f"after {_s(lost.replaced_after_s)}; the job ended {ended:.1f} s after the loss")
          + f"; joins stalled {_s(final.costs.group_stall_s.measured_s)} on average; ray up "
          f"{fake_cluster.took['up']:.1f} s, ray down {fake_cluster.took['down']:.1f} s")


def _s(seconds: float | None) -> str:
    """None: no survivor shared a quorum with the group (it left before the others began)."""
    return "-" if seconds is None else f"{seconds:.2f} s"
