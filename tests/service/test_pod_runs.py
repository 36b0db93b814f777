"""A one-pod job on RunPod's interruptible pods, which join no cluster, end to end against
the fake RunPod (raytrain/testing/runpod_api.py) and its pods' SSH (raytrain/testing/fake_pods.py):
the
real job manager, policy and lifecycle rent an interruptible pod through GraphQL, run the job on it
over `ssh` (raytrain.train.pod_main, the same training loop), lose the pod mid-run with no
notice, rent another and resume from the last committed checkpoint, and end SUCCEEDED with
the loss of an uninterrupted run; no pod is left. Without the run's end being read as a
preemption (its pod gone), the job fails instead; without the fleet letting pods go, one is
left running."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from raytrain.cloud.pod_runs import JOB_ENV, PodFleet
from raytrain.cloud.runpod import RunPodAPI, pod_env
from raytrain.serve.adaptors.pod_cluster import WithPods
from raytrain.serve.jobs.manager import JobManager
from raytrain.spec import JobSpec, JobState, ServiceConfig
from raytrain.testing.fake_pods import PodServers
from raytrain.testing.fake_ray import TrainingRay
from raytrain.testing.runpod_api import FakeRunPod
from raytrain.testing.runs import run_single
from raytrain.testing.s3_server import job_storage
from tests.support.tolerances import SUM_ORDER

RTX4090 = "NVIDIA GeForce RTX 4090"
# A RunPod offer whose spot pods join no cluster; its pods train on this host's CPU.
OFFER = {"provider": "runpod", "region": "secure", "instance_type": "cpu-pod",
         "gpu_kind": "cpu", "gpus_per_node": 1, "intra_link": "gloo-local",
         "network_gbps": 0.1, "max_nodes": 1, "on_demand_usd_per_hour": 1.0,
         "spot_usd_per_hour": 0.3, "spot_interruptions_per_hour": 0.05,
         "spot_joins_cluster": False}


def job() -> dict[str, Any]:
    return {"name": "one-pod",
            "model": {"gpt": {"vocab_size": 128, "dim": 64, "num_layers": 2, "num_heads": 4,
                              "max_seq_len": 32}},
            "data": {"seq_len": 32},
            "training": {"steps": 300, "global_batch_size": 8, "micro_batch_size": 4,
                         "checkpoint_every_steps": 20, "learning_rate": 0.01},
            "resources": {"num_workers": 1, "cpus_per_worker": 1}}


@pytest.fixture
def runpod(tmp_path: Path) -> Iterator[tuple[FakeRunPod, PodServers, Path]]:
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    pods = PodServers()

    def boot(pod: dict[str, Any]) -> None:  # what RunPod's machine does: sshd with the key
        pod["ssh_port"] = pods.start(pod["id"], pod_env(pod), tmp_path / "pods" / pod["id"])

    with FakeRunPod(stock={RTX4090: 2}) as fake:
        fake.on_create = boot
        fake.on_terminate = fake.on_reclaim = lambda pod: pods.stop(pod["id"])
        try:
            yield fake, pods, key
        finally:
            pods.close()


def _service(tmp_path: Path, fake: FakeRunPod, key: Path,
             command: str = f"{sys.executable} -m raytrain.train.pod_main",
             **storage: str) -> tuple[JobManager, PodFleet]:
    """The job manager with one pod type ("pod-spot"), its runs reporting to it; the fleet
    (close it before the fake goes)."""
    offers = tmp_path / "offers.yaml"
    offers.write_text(yaml.safe_dump({"version": "test", "offers": [OFFER]}))
    config = ServiceConfig(
        state_dir=str(tmp_path / "state"), offers_file=str(offers), scheduler_interval_s=0.05,
        node_types={"pod-spot": {"offer": "runpod/secure/cpu-pod", "market": "spot",
                                 "max_nodes": 1}},
        pod_types={"pod-spot": {"gpu_type_id": RTX4090, "gpu_count": 1, "cpus": 1,
                                "command": command}},
        pod_ssh_private_key=str(key), **storage)
    api = RunPodAPI(fake.key, url=fake.url, rest_url=fake.rest_url)
    fleet = PodFleet(api, dict(config.pod_types), key, (tmp_path / "id.pub").read_text(),
                     list_every_s=0.5)
    return JobManager(config.model_dump(mode="json"), cluster=WithPods(TrainingRay(cpus=0),
                                                                        fleet),
                      schedule=False).start(), fleet


def test_a_pod_that_cannot_run_the_job_fails_it_with_the_pods_own_words(
        tmp_path: Path, runpod: tuple[FakeRunPod, PodServers, Path]) -> None:
    """raytrain missing on the pod (a command that cannot start the runner): the job fails
    with what the pod said, after its restarts, and no pod is left."""
    fake, _, key = runpod
    manager, fleet = _service(tmp_path, fake, key, command="echo 'python3: No module named "
                            "raytrain' >&2; exit 1")
    document = job()
    document["training"]["max_restarts"] = 0
    job_id = manager.submit(JobSpec.model_validate(document)).id
    deadline = time.monotonic() + 60
    while not (status := manager.records[job_id].status).state.is_terminal or fake.pods:
        assert time.monotonic() < deadline, (status, fake.pods)
        manager.scheduler.pass_once()
        time.sleep(0.05)
    assert status.state == JobState.FAILED
    # The pod's own words, whether its exit status came back (1: "the pod runner ... exited
    # 1", with the fix) or the fake's SSH server closed the connection first (a busy host).
    assert "No module named raytrain" in str(status.error), status.error
    manager.shutdown()
    fleet.close()
    fleet.api.close()


@pytest.fixture(params=["folder", "bucket"])
def storage(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The job's storage: a folder the pods mount (this host's), or a bucket (moto's S3),
    whose credentials a pod has only from the service (its environment is RunPod's)."""
    with job_storage(request.param, "pods") as settings:
        yield settings


def test_a_one_pod_job_loses_its_interruptible_pod_and_ends_as_if_it_had_not(
        tmp_path: Path, runpod: tuple[FakeRunPod, PodServers, Path],
        storage: dict[str, str]) -> None:
    fake, _, key = runpod
    manager, fleet = _service(tmp_path, fake, key, **storage)
    job_id = manager.submit(JobSpec.model_validate(job())).id
    taken: list[str] = []
    deadline = time.monotonic() + 240
    while not (status := manager.records[job_id].status).state.is_terminal:
        assert time.monotonic() < deadline, status
        if not taken and status.checkpoint is not None and status.checkpoint.step >= 20:
            [pod_id] = [p for p, pod in fake.pods.items() if pod["env"][JOB_ENV] == job_id]
            fake.reclaim(pod_id)  # RunPod takes it back: no notice, its SSH gone at once
            taken.append(pod_id)
        manager.scheduler.pass_once()
        time.sleep(0.05)
    assert status.state == JobState.SUCCEEDED, status.error
    assert taken and status.preemptions == 1 and status.restarts == 0
    assert status.checkpoint is not None
    assert status.checkpoint.path.startswith(storage.get("storage_path", str(tmp_path)))
    [lost] = status.preemption_log
    assert not lost.notice and lost.checkpoint_step is not None and lost.checkpoint_step >= 20
    assert lost.lost_steps == lost.reached_step - lost.checkpoint_step
    assert (status.resources.node_type, status.resources.market) == ("pod-spot", "spot")
    rented = [r["variables"]["input"] for r in fake.requests
              if "RentInterruptible" in r.get("query", "")]
    assert len(rented) == 2 and all(r["bidPerGpu"] == 0.34 and r["ports"] == "22/tcp"
                                    for r in rented)
    assert not [r for r in fake.requests if r.get("rest") == "POST /v2/pods"]  # none on-demand
    assert status.cost_usd > 0
    reference = run_single(JobSpec.model_validate(job()), tmp_path / "reference")
    assert status.result.final_loss == pytest.approx(reference.result["final_loss"], abs=SUM_ORDER)
    decided = status.decisions[0]
    print(f"\none-pod job on interruptible pods: decision to first step "
          f"{status.started_at - decided.time:.1f} s; after the loss, capacity to first step "
          f"{lost.capacity_to_first_step_s:.1f} s, down {lost.down_s:.1f} s, steps redone "
          f"{lost.lost_steps}")
    deadline = time.monotonic() + 30
    while fake.pods:  # the last pod goes once its run ended and the job let it go
        assert time.monotonic() < deadline, fake.pods
        manager.scheduler.pass_once()
        time.sleep(0.1)
    manager.shutdown()
    fleet.close()
    fleet.api.close()
