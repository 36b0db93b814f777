"""Faults injected into the running service on a local Ray, each with a job in flight: a
cancel while the worker group starts, a failure that would repeat, a job that can never run
and one that must wait, and a kill -9 of the job manager. After each case no placement group
is left (checked through Ray's placement-group table), and the next case's jobs train on the
same cluster; the last one ends with jobs that train to SUCCEEDED."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import ray

from raytrain import Client, JobSpec, JobState
from raytrain.cli import main as cli_main
from tests.integration.conftest import NUM_CPUS, Service, cancel_what_is_left, wait_for
from tests.integration.test_service import cpus_free, job_spec
from tests.unit.test_training import run_single

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def nothing_left_behind(service: Service) -> Iterator[None]:
    yield
    cancel_what_is_left(service)  # before the wait: this fixture's end comes first
    wait_for(lambda: not live_placement_groups(), 150, "every placement group to be released")
    wait_for(lambda: cpus_free() >= NUM_CPUS, 60, "every CPU to be free")


def test_a_cancel_while_the_worker_group_starts_frees_everything(service: Service) -> None:
    """Cancelled while the worker group is still starting, a job ends CANCELLED with no held
    CPU and no placement group left behind. (A cancel once training runs is in
    test_dashboard.py, through the page.)"""
    client = Client(service.url)
    starting = client.submit(job_spec(steps=100_000, name="cancel-while-starting"))
    wait_for(lambda: starting.status().state == JobState.PROVISIONING, 60, "PROVISIONING")
    time.sleep(3)  # into the worker group's start-up
    assert starting.status().progress.step == 0
    assert starting.cancel().state == JobState.CANCELLED
    wait_for(lambda: cpus_free() >= NUM_CPUS and not live_placement_groups(), 150,
             "the starting group's CPUs and placement group to be released")


def test_an_impossible_job_is_refused_and_a_small_one_passes_a_waiting_big_one(
        service: Service, tmp_path: Path) -> None:
    """422 for a group that never fits the cluster; a big job that fits but must wait does
    not hold up a small one that fits now (backfill; that it is passed only so often is
    tests/unit/test_api.py's). The small one fails in its worker: a raytrain error raised
    there crosses Ray's processes with its message and fix, its traceback in the rank's log,
    not in the status."""
    never = service.http.post(f"{service.url}/v1/jobs", json={
        "resources": {"num_workers": NUM_CPUS * 2, "cpus_per_worker": 1},
        "training": {"global_batch_size": 16}})
    assert never.status_code == 422 and "never" in never.text and "To fix" in never.text
    client = Client(service.url)
    one_worker = {"num_workers": 1, "cpus_per_worker": 1}
    running = client.submit({**job_spec(steps=100_000, name="holds-one-cpu"),
                             "resources": one_worker})
    wait_for(lambda: running.status().state != JobState.PENDING, 60, "the first job to start")
    big = client.submit(job_spec(steps=10, name="big"))  # both CPUs: must wait
    tokens = tmp_path / "three-tokens.bin"
    tokens.write_bytes(bytes(6))  # 3 uint16 tokens: fewer than seq_len + 1
    small = {**job_spec(steps=10, name="short-file"), "resources": one_worker}
    small["data"] = {"kind": "token_file", "path": str(tokens), "seq_len": 32}
    status = client.submit(small).wait()
    assert big.status().state == JobState.PENDING and "queued" in big.status().message
    assert status.state == JobState.FAILED
    # It failed before its first step, so no retry could go differently: one attempt only,
    # though max_restarts allows 3.
    assert status.restarts == 0 and status.spec.training.max_restarts == 3
    assert status.error is not None and "fewer than seq_len + 1" in status.error
    assert "To fix" in status.error and "AttributeError" not in status.error
    assert "Traceback" not in status.error and f"raytrain logs {status.id}" in status.message
    logs = client.logs(status.id)
    assert any("SpecError" in rank.text for rank in logs.ranks)
    assert all(rank.text.count("==== ") == 1 for rank in logs.ranks)  # started once
    for job in (big, running):
        assert job.cancel().state == JobState.CANCELLED


def live_placement_groups() -> list[str]:
    return [g for g, info in ray.util.placement_group_table().items()
            if info["state"] != "REMOVED"]


def manager_pid() -> int:
    [pid] = [p.pid for p in psutil.process_iter(["cmdline"])
             if " ".join(p.info.get("cmdline") or []).startswith("ray::JobManager")]
    return pid


def test_a_killed_job_manager_comes_back_and_its_job_ends_as_if_never_stopped(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """kill -9 of the job manager mid-job, and the HTTP layer redeployed too: records and
    event numbers survive, Ray restarts the manager, it reclaims the dead run's placement
    group, and the job resumes from its checkpoint to the loss an uninterrupted run reaches.
    (That a job queued behind it stays behind it is tests/unit/test_api.py's.)"""
    from raytrain.serve.deploy import deploy, undeploy

    client = Client(service.url)
    # An ended job of the tests above, to check its event numbers across the restart.
    ended = next((job for job in client.list() if job.state.is_terminal), None)
    last_seq_before = [e.seq for e in client.events(ended.id)][-1] if ended else -1
    spec = job_spec(steps=300, checkpoint_every=40, name="survivor")
    # Submitted the way `curl -d @job.json` does: a JSON body labelled form-encoded.
    response = service.http.post(f"{service.url}/v1/jobs", content=json.dumps(spec),
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 202, response.text
    survivor = client.job(response.json()["id"])
    one_process = JobSpec.model_validate({**spec, "resources": {"num_workers": 1}})
    # The uninterrupted run's loss, in this process while the cluster trains.
    reference = ThreadPoolExecutor(1).submit(run_single, one_process, tmp_path / "reference")
    wait_for(lambda: (s := survivor.status()).checkpoint is not None and s.progress.step >= 50,
             150, "a checkpoint and some steps")
    before = {job.id: job.state for job in client.list()}

    os.kill(manager_pid(), signal.SIGKILL)  # the manager dies mid-job ...
    assert before[survivor.id] == JobState.RUNNING, "the kill came too late to test a resume"
    undeploy(stop_jobs=False)  # ... and the HTTP layer goes away too
    host, port = service.url.removeprefix("http://").split(":")
    assert deploy(service.config, host, int(port)) == service.url  # type: ignore[attr-defined]

    after = {job.id: job.state for job in client.list()}
    assert after.keys() == before.keys() and after[survivor.id] != JobState.SUCCEEDED
    assert {k: v for k, v in after.items() if v.is_terminal} == \
        {k: v for k, v in before.items() if v.is_terminal}
    if ended is not None:
        replayed = list(client.events(ended.id))
        assert replayed[-1].type == "end"
        # Numbering only grows across the restart: a client resuming with an old
        # Last-Event-ID sees the reloaded job's events, not nothing.
        assert min(e.seq for e in replayed) > last_seq_before
        assert [e.seq for e in client.events(ended.id, after=last_seq_before)] == \
            [e.seq for e in replayed]

    final = survivor.wait()
    assert final.state == JobState.SUCCEEDED, final.error
    assert final.result.final_loss == pytest.approx(reference.result().result["final_loss"],
                                                    abs=1e-5)
    wait_for(lambda: not live_placement_groups(), 60, "every placement group to be released")
    assert cli_main(["--server", service.url, "status", survivor.id]) == 0
    assert "SUCCEEDED" in capsys.readouterr().out
