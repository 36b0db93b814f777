"""The HTTP API in one process: `build_app` over a real job manager whose Ray adaptor is the
recording fake (raytrain/testing/fake_ray.py), driven through httpx's ASGITransport. Rank 0's
reports
are the manager's own methods, called as the workers call them. The same paths also run on a
real cluster in tests/service/ray/test_service.py; these cover what that one cannot afford
(every status code, the event stream's order, restarts, a stop that does not come)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from raytrain.core import lifecycle as lc
from raytrain.core.resolve import plan_summary
from raytrain.serve.http.app import InProcess
from raytrain.serve.http.feeds import Feeds
from raytrain.serve.http.limits import MAX_BODY_BYTES
from raytrain.spec import JobSpec, PlanSummary
from raytrain.testing.fake_ray import FakeRay
from tests.support.service import Service, progress, result, small_job


@pytest.fixture
def service(tmp_path: Path) -> Service:
    return Service(tmp_path)


def test_a_job_runs_to_the_end_and_its_stream_says_each_state_once(service: Service) -> None:
    answer = service.request("POST", "/v1/jobs", json=small_job())
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    assert answer.json()["state"] == "PENDING" and answer.json()["plan"]["description"]
    service.tick()
    assert service.cluster.calls == [("reclaim_runners",), ("reclaim_groups", frozenset()),
                                     ("launch", job_id)]
    assert service.state(job_id) == "PROVISIONING"
    attempt = service.train(job_id, 60)
    status = service.request("GET", f"/v1/jobs/{job_id}").json()
    assert status["state"] == "RUNNING" and status["progress"]["step"] == 60
    assert status["checkpoint"] == {"step": 60, "path": "/ckpt/60", "save_s": 0.5,
                                    "durable_s": 0.5,
                                    "committed_at": status["checkpoint"]["committed_at"]}
    service.manager.report_finished(job_id, attempt, result(60))
    service.cluster.finish(job_id)
    service.tick()
    status = service.request("GET", f"/v1/jobs/{job_id}").json()
    assert status["state"] == "SUCCEEDED" and status["result"]["steps"] == 60
    assert ("stop", job_id, None) in service.cluster.calls  # its runner is ended
    events = service.events(job_id)
    assert [e["seq"] for e in events] == list(range(len(events)))
    states = [e["data"]["state"] for e in events if e["type"] == "state"]
    assert states == ["PENDING", "PROVISIONING", "RUNNING", "SUCCEEDED"]
    assert [e["type"] for e in events].count("progress") == 60
    assert events[-1]["type"] == "end" and events[-1]["data"]["state"] == "SUCCEEDED"
    # resuming after the last event: nothing but the end is ever sent twice
    assert service.events(job_id, after=events[-2]["seq"]) == [events[-1]]


def test_status_codes_name_the_field_and_the_fix(service: Service) -> None:
    assert service.request("GET", "/v1/jobs/nope").status_code == 404
    assert service.request("DELETE", "/v1/jobs/nope").status_code == 404
    bad = service.request("POST", "/v1/jobs", json={**small_job(), "trainig": {}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "trainig"]
    too_many = service.request("POST", "/v1/jobs", json=small_job(num_workers=8))
    assert too_many.status_code == 422
    assert too_many.json()["detail"][0]["loc"] == ["body", "resources", "num_workers"]
    huge = service.request("POST", "/v1/jobs", content=b"x" * (MAX_BODY_BYTES + 1))
    assert huge.status_code == 413 and "To fix" in huge.json()["detail"]
    position = service.request("GET", "/v1/jobs/x/events", params={"after": "abc"})
    assert position.status_code == 422
    assert service.request("GET", "/readyz").json()["ready"] is True
    assert service.manager.list_jobs()["jobs"] == "[]"  # nothing bad was queued
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    running = service.request("DELETE", f"/v1/jobs/{job_id}", params={"purge": "true"})
    assert running.status_code == 409 and "cancel it first" in running.json()["detail"]
    assert service.request("DELETE", f"/v1/jobs/{job_id}").json()["state"] == "CANCELLED"
    again = service.request("DELETE", f"/v1/jobs/{job_id}")
    assert again.status_code == 409 and "already ended" in again.json()["detail"]
    assert service.request("DELETE", f"/v1/jobs/{job_id}", params={"purge": "true"}).is_success
    assert service.request("GET", f"/v1/jobs/{job_id}").status_code == 404


def test_jobs_come_a_page_at_a_time_oldest_first(service: Service) -> None:
    ids = []
    for _ in range(5):
        ids.append(service.request("POST", "/v1/jobs", json=small_job()).json()["id"])
        service.cluster.advance(1.0)
    seen, params = [], {"limit": 2}
    while True:
        page = service.request("GET", "/v1/jobs", params=params)
        seen += [job["id"] for job in page.json()]
        if "X-Next-Cursor" not in page.headers:
            break
        assert 'rel="next"' in page.headers["Link"]
        params = {"limit": 2, "after": page.headers["X-Next-Cursor"]}
    assert seen == ids
    metrics = service.request("GET", "/metrics").text
    assert 'raytrain_jobs{state="PENDING"} 5.0' in metrics


def test_a_stopped_job_goes_on_as_a_new_job_from_its_checkpoint(
        service: Service, tmp_path: Path) -> None:
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    assert service.request("POST", f"/v1/jobs/{job_id}/resume", json={}).status_code == 409
    service.tick()
    service.train(job_id, 12)  # checkpoints at /ckpt/12, which is not on this machine
    service.request("DELETE", f"/v1/jobs/{job_id}")
    service.cluster.finish(job_id)  # its workers leave
    service.tick()
    refused = service.request("POST", f"/v1/jobs/{job_id}/resume", json={})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == [
        "body", "training", "resume_from"]
    saved = tmp_path / "ckpt" / "step_00000012"  # as if the path were shared storage
    saved.mkdir(parents=True)
    (saved / "COMMITTED").touch()
    record = service.manager.records[job_id]
    record.status.checkpoint = record.status.checkpoint.model_copy(update={"path": str(saved)})
    again = service.request("POST", f"/v1/jobs/{job_id}/resume", json={"budget_usd": 5.0},
                            headers={"Idempotency-Key": "r-1"})
    assert again.status_code == 202, again.text
    new = again.json()
    assert new["id"] != job_id and new["state"] == "PENDING"
    assert new["spec"]["training"]["resume_from"] == str(saved)
    assert new["spec"]["capacity"]["budget_usd"] == 5.0
    retried = service.request("POST", f"/v1/jobs/{job_id}/resume", json={"budget_usd": 5.0},
                              headers={"Idempotency-Key": "r-1"})
    assert retried.json()["id"] == new["id"]  # a retried resume queues nothing more
    twice = service.request("POST", f"/v1/jobs/{job_id}/resume", json={})  # a new request
    assert twice.status_code == 409 and f"already resumed as job {new['id']}" in \
        twice.json()["detail"]
    assert service.request("POST", "/v1/jobs/nope/resume", json={}).status_code == 404
    running = service.request("POST", f"/v1/jobs/{new['id']}/resume", json={})
    assert running.status_code == 409 and "To fix" in running.json()["detail"]
    # the old job (and its checkpoint) stays while the new one has none of its own
    kept = service.request("DELETE", f"/v1/jobs/{job_id}", params={"purge": "true"})
    assert kept.status_code == 409 and new["id"] in kept.json()["detail"]
    service.request("DELETE", f"/v1/jobs/{new['id']}")  # cancelled: the old one may go
    gone = service.request("DELETE", f"/v1/jobs/{job_id}", params={"purge": "true"})
    assert gone.status_code == 200


def test_a_cancel_while_the_group_starts_stops_it_at_once_and_frees_its_capacity(
        service: Service) -> None:
    """A group that has not started has nothing to save: its runner is stopped at the
    cancel (not when the start it would abandon is over), and the next job starts on the
    capacity at once. A group that comes up all the same is told to stop."""
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    assert service.request("DELETE", f"/v1/jobs/{job_id}").json()["state"] == "CANCELLED"
    assert ("stop", job_id, None) in service.cluster.calls
    assert service.manager.worker_group_started(
        job_id, 0, {"placement_group": "pg-7", "accelerator": "cpu", "nodes": 1}) == -1
    assert service.manager.report_progress(job_id, 1, progress(1)) == {"stop": True}
    events = service.events(job_id)
    assert [e["type"] for e in events][-1] == "end"
    assert [e["data"]["state"] for e in events if e["type"] == "state"] == [
        "PENDING", "PROVISIONING", "CANCELLED"]
    # the capacity it held is free again: the next job starts without waiting
    next_id = service.request("POST", "/v1/jobs", json=small_job(num_workers=4)).json()["id"]
    service.tick()
    assert service.state(next_id) == "PROVISIONING"


def test_a_cancelled_running_group_that_does_not_leave_is_killed_after_its_grace(
        service: Service) -> None:
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    attempt = service.manager.worker_group_started(
        job_id, 0, {"placement_group": "pg-7", "accelerator": "cpu", "nodes": 1})
    assert attempt == 1
    assert service.request("DELETE", f"/v1/jobs/{job_id}").json()["state"] == "CANCELLED"
    assert service.manager.report_progress(job_id, 1, progress(1)) == {"stop": True}
    assert not [c for c in service.cluster.calls if c[0] == "stop"]  # it may still save
    next_id = service.request("POST", "/v1/jobs", json=small_job(num_workers=4)).json()["id"]
    service.tick()
    assert service.state(next_id) == "PENDING"  # its CPUs are counted until it goes
    service.cluster.advance(lc.CANCEL_GRACE_S + 1)
    service.tick()
    assert ("stop", job_id, "pg-7") in service.cluster.calls
    service.tick()
    assert service.state(next_id) == "PROVISIONING"


def test_a_failure_before_the_first_step_is_not_retried_and_says_where_the_logs_are(
        service: Service) -> None:
    job = small_job()
    job["training"]["max_restarts"] = 3
    job_id = service.request("POST", "/v1/jobs", json=job).json()["id"]
    service.tick()
    service.manager.worker_group_started(job_id, 0, {"placement_group": "pg-1"})
    service.cluster.finish(job_id, error="training failed: ValueError: bad data")
    service.tick()
    status = service.request("GET", f"/v1/jobs/{job_id}").json()
    assert status["state"] == "FAILED" and status["restarts"] == 0
    assert "bad data" in status["error"] and f"raytrain logs {job_id}" in status["message"]


def test_a_restarted_manager_requeues_running_jobs_and_numbers_events_past_the_old_ones(
        tmp_path: Path) -> None:
    """A job queued behind the running one stays behind it: it runs once that one ends."""
    first = Service(tmp_path, cluster=FakeRay(cpus=2))
    job_id = first.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    first.tick()
    behind = first.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    first.tick()
    first.train(job_id, 12)
    assert first.state(behind) == "PENDING"
    last_seq = first.recorded(job_id)[-1]["seq"]
    # the manager is lost; a new one on the same store and cluster takes over
    second = Service(tmp_path, cluster=first.cluster)
    status = second.request("GET", f"/v1/jobs/{job_id}").json()
    assert status["state"] == "PENDING" and status["restarts"] == 1
    assert status["checkpoint"]["step"] == 12
    replayed = second.recorded(job_id)
    assert replayed[0]["seq"] > last_seq and replayed[0]["data"]["state"] == "PENDING"
    assert ("reclaim_runners",) in second.cluster.calls
    second.tick()
    assert second.state(job_id) == "PROVISIONING" and second.state(behind) == "PENDING"
    second.cluster.finish(job_id, error="stopped")  # the resumed run ends (fails): CPUs free
    second.tick()
    assert second.state(behind) == "PROVISIONING"


def test_small_jobs_pass_a_waiting_big_one_only_so_often(tmp_path: Path) -> None:
    service = Service(tmp_path, max_backfill_passes=2)
    first = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    big = service.request("POST", "/v1/jobs", json=small_job(num_workers=4)).json()["id"]
    service.tick()
    assert service.state(first) == "PROVISIONING" and service.state(big) == "PENDING"
    passed = []
    for _ in range(3):  # small jobs fit beside the first one; the big one waits
        small = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
        service.tick()
        passed.append(service.state(small))
        if service.state(small) == "PROVISIONING":
            service.cluster.finish(small, error="stopped by the test")
            service.tick()
    assert passed == ["PROVISIONING", "PROVISIONING", "PENDING"]
    assert "queued" in service.request("GET", f"/v1/jobs/{small}").json()["message"]
    # the first job ends: the big one starts before the small one that came after it
    service.cluster.finish(first, error="stopped by the test")
    service.tick()
    assert service.state(big) == "PROVISIONING" and service.state(small) == "PENDING"


def test_an_auto_job_is_planned_once_in_its_life(tmp_path: Path) -> None:
    """The layout is decided once, at submit, and stored with the job: a reload, the run and
    every worker read it, and a planner (or hardware catalog) that has since changed cannot
    make a stored job invalid. The planner's calls are counted over the job's whole life
    (submit, a service restart, the run to its end): one. Planning again in the run (as the
    service did after capacity came) makes it two."""
    calls: list[JobSpec] = []

    def counting(spec: JobSpec, **kwargs: Any) -> PlanSummary:
        calls.append(spec)
        return plan_summary(spec, **kwargs)

    job = small_job(num_workers=4, cpus_per_worker=0.5)
    job["parallel"] = {"strategy": "auto"}
    first = Service(tmp_path, planner=counting)
    answer = first.request("POST", "/v1/jobs", json=job)
    assert answer.status_code == 202, answer.text
    planned = answer.json()["plan"]
    assert planned["layout"]["dp_replicate"] * planned["layout"]["dp_shard"] * \
        planned["layout"]["tp"] * planned["layout"]["pp"] == 4
    assert planned["catalog_version"] and planned["description"]
    assert len(calls) == 1
    second = Service(tmp_path, cluster=first.cluster, planner=counting)  # a reload
    job_id = answer.json()["id"]
    assert second.request("GET", f"/v1/jobs/{job_id}").json()["plan"] == planned
    second.tick()
    run = second.cluster.runs[job_id]
    assert asdict(run.layout) == planned["layout"]  # what every worker builds
    steps = job["training"]["steps"]
    attempt = second.train(job_id, steps)
    second.manager.report_finished(job_id, attempt, result(steps))
    second.cluster.finish(job_id)
    second.tick()
    assert second.state(job_id) == "SUCCEEDED"
    assert second.request("GET", "/metrics").status_code == 200
    assert len(calls) == 1


def test_the_streams_of_one_job_share_one_wait_on_the_manager(service: Service) -> None:
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    waits = []
    wait_events = service.manager.wait_events
    service.manager.wait_events = lambda *args: waits.append(args) or wait_events(*args)

    async def twenty_streams() -> list[Any]:
        feeds = Feeds(InProcess(service.manager), poll_s=0.2)

        async def one() -> Any:
            async with feeds.follow(job_id) as feed:
                return await feed.after(-1, timeout_s=5.0)
        return await asyncio.gather(*(one() for _ in range(20)))

    batches = asyncio.run(twenty_streams())
    assert batches[0] and all(batch == batches[0] for batch in batches)
    states = [json.loads(sent.text.split("data: ", 1)[1])["data"]["state"]
              for sent in batches[0]]
    assert states == ["PENDING", "PROVISIONING"]
    # the history, then perhaps the wait for more that the last stream's leaving cancels;
    # not one each
    assert [after for _, after, _ in waits] in ([-1], [-1, 1])


def test_a_plan_for_one_layout_on_a_named_shape_or_the_field_that_stops_it(
        service: Service) -> None:
    """POST /v1/plans with a layout and a shape evaluates that layout there; one that cannot
    train the model is a 422 naming the field under `layout`, with the fix."""
    spec = {**small_job(), "training": {"global_batch_size": 16, "micro_batch_size": 2}}
    answer = service.request("POST", "/v1/plans", json={
        "spec": spec, "shape": "dgx-h100", "layout": {"dp_shard": 4, "tp": 2}})
    assert answer.status_code == 200, answer.text
    plans = answer.json()
    assert (plans["gpus"], plans["accelerator"], plans["precision"]) == (8, "h100-sxm", "bf16")
    [row] = plans["plans"]
    assert row["layout"].startswith("dp_shard4 tp2") and row["breakdown"]["total"] > 0
    refused = service.request("POST", "/v1/plans", json={
        "spec": spec, "layout": {"dp_shard": 2, "tp": 3}})
    assert refused.status_code == 422
    first = refused.json()["detail"][0]
    assert first["loc"] == ["body", "layout", "tp"] and "To fix" in first["msg"]


def test_a_factory_that_cannot_be_imported_is_refused_at_submit_and_nothing_starts(
        tmp_path: Path) -> None:
    """An allowed package, but a name in it that does not exist (or a module that does not):
    422 naming the field, before a worker group starts or a node is bought for it."""
    service = Service(tmp_path, allowed_import_packages=["raytrain.testing"])
    good = {**small_job(), "model": {"kind": "import",
                                     "factory": "raytrain.testing.jobs:make_tiny_model",
                                     "options": {"dim": 8}}}
    for factory, said in (("raytrain.testing.jobs:nope", "no attribute"),
                          ("raytrain.testing.no_such_module:build", "cannot import")):
        document = {**good, "model": {**good["model"], "factory": factory}}
        answer = service.request("POST", "/v1/jobs", json=document)
        assert answer.status_code == 422, answer.text
        [error] = answer.json()["detail"]
        assert error["loc"][-2:] == ["model", "factory"] and said in error["msg"]
        assert "To fix" in error["msg"]
    assert service.request("GET", "/v1/jobs").json() == []
    service.tick()
    assert service.cluster.runs == {} and service.cluster.requests == {}  # nothing started
    assert service.request("POST", "/v1/jobs", json=good).status_code == 202


def test_a_token_file_that_is_missing_or_too_short_is_refused_at_submit(
        tmp_path: Path) -> None:
    """A token file the service's node cannot read, or one with no window of seq_len + 1
    tokens: 422 naming data.path with the fix, before a worker group starts."""
    service = Service(tmp_path)
    short = tmp_path / "three-tokens.bin"
    short.write_bytes(bytes(6))  # 3 uint16 tokens
    enough = tmp_path / "enough.bin"
    enough.write_bytes(bytes(2 * 33))  # 33 uint16 tokens: one window of seq_len 32
    for path, said in ((tmp_path / "missing.bin", "does not exist"),
                       (short, "holds 3 tokens, fewer than seq_len + 1 = 33")):
        document = {**small_job(), "data": {"kind": "token_file", "path": str(path),
                                            "seq_len": 32}}
        answer = service.request("POST", "/v1/jobs", json=document)
        assert answer.status_code == 422, answer.text
        [error] = answer.json()["detail"]
        assert error["loc"][-2:] == ["data", "path"] and said in error["msg"], error
        assert "To fix" in error["msg"]
    service.tick()
    assert service.cluster.runs == {}  # nothing started
    document = {**small_job(), "data": {"kind": "token_file", "path": str(enough),
                                        "seq_len": 32}}
    assert service.request("POST", "/v1/jobs", json=document).status_code == 202


def test_a_job_that_can_never_start_here_is_told_so_first(tmp_path: Path) -> None:
    """100,000 workers on a 4-CPU cluster, with a batch that does not divide among them: the
    capacity refusal comes first, not a batch-size fix that would lead to it next."""
    service = Service(tmp_path)
    document = small_job(num_workers=100_000)
    answer = service.request("POST", "/v1/jobs", json=document)
    assert answer.status_code == 422, answer.text
    first, *rest = answer.json()["detail"]
    assert first["loc"] == ["body", "resources", "num_workers"]
    assert "can never start here" in first["msg"] and "To fix" in first["msg"]
    assert rest and any("global_batch_size" in str(e["loc"]) for e in rest)
    # what fits the cluster but has other errors gets those alone
    fits = {**small_job(), "training": {**small_job()["training"], "global_batch_size": 7}}
    answer = service.request("POST", "/v1/jobs", json=fits)
    assert answer.status_code == 422
    assert all("never start" not in e["msg"] for e in answer.json()["detail"])
