"""Faults injected into the running service on a local Ray, each with a job in flight: a
cancel while the worker group starts, a job that can never run, a failure in a worker that
would repeat, and a kill -9 of a training worker then of the job manager. After
each case no placement group is left (checked through Ray's placement-group table), and the
next case's jobs train on the same cluster; the last one ends with a job trained to
SUCCEEDED."""

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
from raytrain.serve.jobs.actor import StartedJobManager
from raytrain.testing.ray_service import (
    NUM_CPUS,
    Service,
    cancel_what_is_left,
    cpus_free,
    job_spec,
    reference_run,
    train_worker_pids,
    wait_for,
)
from tests.support.tolerances import SUM_ORDER

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def nothing_left_behind(service: Service) -> Iterator[None]:
    yield
    cancel_what_is_left(service)  # before the wait: this fixture's end comes first
    wait_for(lambda: not live_placement_groups(), 150, "every placement group to be released")
    wait_for(lambda: cpus_free() >= NUM_CPUS, 60, "every CPU to be free")


def test_a_cancel_while_the_worker_group_starts_frees_everything(service: Service) -> None:
    """Cancelled while the worker group is still starting, a job ends CANCELLED and its
    runner is stopped at once: no runner, worker, held CPU or placement group is left, within
    seconds rather than after the start it would have abandoned. (A cancel once training
    runs is the jobs guide's second snippet, test_service.py.)"""
    client = Client(service.url)
    starting = client.submit(job_spec(steps=100_000, name="cancel-while-starting"))
    wait_for(lambda: starting.status().state == JobState.PROVISIONING, 60, "PROVISIONING")
    time.sleep(3)  # into the worker group's start-up
    assert starting.status().progress.step == 0
    assert starting.cancel().state == JobState.CANCELLED
    runner = f"raytrain-job-{starting.id}"
    wait_for(lambda: runner not in {a["name"] for a in ray.util.list_named_actors(True)}
             and not train_worker_pids() and cpus_free() >= NUM_CPUS
             and not live_placement_groups(), 60,
             "the starting group's runner, workers, CPUs and placement group to be released")


def test_an_impossible_job_is_refused_and_a_workers_error_reaches_the_status_with_its_fix(
        service: Service, tmp_path: Path) -> None:
    """422 for a group that never fits the cluster, before anything starts. A job that fails
    in its worker: a raytrain error raised there crosses Ray's processes with its message and
    fix, its traceback in the rank's log, not in the status. (That a big job waiting for room
    does not hold up a small one that fits now is tests/pure/test_api.py's.)"""
    never = service.http.post(f"{service.url}/v1/jobs", json={
        "resources": {"num_workers": NUM_CPUS * 2, "cpus_per_worker": 1},
        "training": {"global_batch_size": 16}})
    assert never.status_code == 422 and "never" in never.text and "To fix" in never.text
    client = Client(service.url)
    # Token ids past the model's vocabulary: found only when a worker reads a batch (a
    # file too short to train on is refused at submit, tests/pure/test_api.py).
    tokens = tmp_path / "big-ids.bin"
    tokens.write_bytes(b"\xff" * 2 * 64)  # 64 uint16 tokens of id 65535
    small = {**job_spec(steps=10, name="big-ids"),
             "resources": {"num_workers": 1, "cpus_per_worker": 1}}
    small["data"] = {"kind": "token_file", "path": str(tokens), "seq_len": 32}
    status = client.submit(small).wait()
    assert status.state == JobState.FAILED
    # It failed before its first step, so no retry could go differently: one attempt only,
    # though max_restarts allows 3.
    assert status.restarts == 0 and status.spec.training.max_restarts == 3
    assert status.error is not None and "token id 65535 >= vocab_size" in status.error
    assert "To fix" in status.error and "AttributeError" not in status.error
    assert "Traceback" not in status.error and f"raytrain logs {status.id}" in status.message
    logs = client.logs(status.id)
    assert any("SpecError" in rank.text for rank in logs.ranks)
    assert all(rank.text.count("==== ") == 1 for rank in logs.ranks)  # started once


def live_placement_groups() -> list[str]:
    return [g for g, info in ray.util.placement_group_table().items()
            if info["state"] != "REMOVED"]


def manager_pid() -> int:
    title = f"ray::{StartedJobManager.__name__}"  # the actor's process, named for its class
    [pid] = [p.pid for p in psutil.process_iter(["cmdline"])
             if " ".join(p.info.get("cmdline") or []).startswith(title)]
    return pid


def test_a_killed_worker_then_a_killed_job_manager_and_the_job_ends_as_if_never_stopped(
    service: Service, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One job, two faults. A training worker is killed (kill -9): on this fixed cluster the
    job's two data-parallel replicas are replica groups, so the other group trains on with no
    restart of the job, within 15 s, and the lost one is started again and joins it. Then
    kill -9 of the job manager mid-job, and the HTTP layer redeployed too: records and event
    numbers survive, Ray restarts the manager, it reclaims the dead run's placement groups, and
    the job resumes from its checkpoint. It ends with the loss an uninterrupted run reaches.
    (That a job queued behind it stays behind it is tests/pure/test_api.py's.) With fixed
    clusters rigid (core.elastic.run_groups returning 1 there) the kill restarts the job and
    no group is recorded lost: the test fails."""
    from raytrain.serve.deploy import deploy, undeploy

    client = Client(service.url)
    # An ended job of the tests above, to check its event numbers across the restart.
    ended = next((job for job in client.list() if job.state.is_terminal), None)
    last_seq_before = [e.seq for e in client.events(ended.id)][-1] if ended else -1
    steps = 1000  # the faults must land mid-run even on a fast machine
    spec = job_spec(steps=steps, checkpoint_every=20, name="survivor")
    # Submitted the way `curl -d @job.json` does: a JSON body labelled form-encoded.
    response = service.http.post(f"{service.url}/v1/jobs", content=json.dumps(spec),
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 202, response.text
    survivor = client.job(response.json()["id"])
    one_process = JobSpec.model_validate({**spec, "resources": {"num_workers": 1}})
    # The uninterrupted run's loss, in this process while the cluster trains.
    reference = ThreadPoolExecutor(1).submit(reference_run, one_process, tmp_path / "reference")

    # A worker dies. Progress is published at the steps where ranks agree on the loss, and
    # checkpoint steps are among them, so the reported step may sit on the latest checkpoint.
    status = wait_for(lambda: (s := survivor.status()).checkpoint is not None
                      and s.progress.step >= 40 and s.progress.groups == 2 and s, 150,
                      "both replica groups in one quorum, a checkpoint and some steps")
    os.kill(train_worker_pids()[-1], signal.SIGKILL)
    killed_at = survivor.status().progress.step
    assert killed_at < steps - 500, "the kill came too late"
    lost = wait_for(lambda: (s := survivor.status()).preemption_log
                    and s.preemption_log[0].stall_s is not None and s, 120,
                    "the other group to train on without the lost one")
    [record] = lost.preemption_log
    assert lost.restarts == 0 and lost.state == JobState.RUNNING
    assert not record.notice and record.survivors == 1 and record.lost_steps <= 1
    assert record.stall_s is not None and record.stall_s <= 15.0, record
    resumed = wait_for(lambda: (s := survivor.status()).progress.groups == 2
                       and s.preemption_log[0].replaced_after_s is not None and s, 150,
                       "the lost group to be started again and join")
    assert resumed.restarts == 0
    print(f"\nfixed cluster, one worker killed: the other group stalled {record.stall_s:.2f} s "
          f"(steps redone {record.lost_steps}); the lost group joined again after "
          f"{resumed.preemption_log[0].replaced_after_s:.1f} s")
    assert resumed.progress.step < steps - 200, "too near the end to kill the manager"
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
    events = list(survivor.events())
    recovering = [e for e in events if e.type == "state" and e.data["state"] == "RECOVERING"
                  and "resumed_step" in e.data]
    assert recovering and recovering[0].data["resumed_step"] >= status.checkpoint.step
    for resume in recovering:  # after each resume, no step goes back past its checkpoint
        later = [e for e in events if e.seq > resume.seq]
        upto = next((i for i, e in enumerate(later) if e in recovering), len(later))
        after_steps = [e.data["step"] for e in later[:upto] if e.type == "progress"]
        assert not after_steps or min(after_steps) > resume.data["resumed_step"]
    assert final.result is not None and final.result.steps == steps
    assert final.result.final_loss == pytest.approx(reference.result().result["final_loss"],
                                                    abs=SUM_ORDER)
    wait_for(lambda: not live_placement_groups(), 60, "every placement group to be released")
    assert cli_main(["--server", service.url, "status", survivor.id]) == 0
    assert "SUCCEEDED" in capsys.readouterr().out
