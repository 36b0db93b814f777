"""Status reads from the HTTP replica's memory (serve.http.reads) and replicas sharing one port
(serve.http.front), over real HTTP on 127.0.0.1 with a real job manager on the recording fake of
Ray."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import httpx

from raytrain import Client, JobState, JobStatus
from raytrain.client import Job
from raytrain.serve.http.app import InProcess, build_app
from raytrain.serve.http.auth import operator_token
from raytrain.serve.http.front import Front
from raytrain.serve.http.reads import StatusCache
from raytrain.serve.jobs.manager import JobManager
from raytrain.serve.jobs.versions import Versions
from raytrain.spec import ServiceConfig
from raytrain.testing.fake_ray import FakeRay
from tests.support.service import small_job

CHANGE_SEEN_S = 10.0  # generous: the copy follows within one long-poll answer


class CountingManager(JobManager):
    """The real job manager, counting the status reads that reach it, its changes reaching
    the replica late (as over a slow link): a copy that ignored the replica's own writes
    would be read stale."""

    reads = 0
    LATE_S = 0.2

    def get_job(self, job_id: str) -> str | None:
        CountingManager.reads += 1
        return super().get_job(job_id)

    def changes(self, epoch: str | None, since: int, timeout_s: float) -> dict[str, Any]:
        answer = super().changes(epoch, since, timeout_s)
        time.sleep(self.LATE_S)
        return answer


class SlowCopyManager(CountingManager):
    """Its changes reach the replica's copy a second behind its event streams."""

    LATE_S = 1.0


def serve(tmp_path: Path, port: int = 0, kind: type[CountingManager] = CountingManager
          ) -> tuple[CountingManager, Front, httpx.Client]:
    config = ServiceConfig(state_dir=str(tmp_path))
    manager = kind(config.model_dump(mode="json"), cluster=FakeRay(cpus=64),
                   schedule=False).start()
    front = Front(build_app(InProcess(manager), cached_reads=1.0), "127.0.0.1", port)
    http = httpx.Client(base_url=f"http://127.0.0.1:{front.sock.getsockname()[1]}",
                        headers={"Authorization": f"Bearer {operator_token(config)}"})
    return manager, front, http


def state_of(http: httpx.Client, job_id: str) -> str:
    answer = http.get(f"/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    return answer.json()["state"]


def test_reads_come_from_memory_and_always_show_this_replicas_own_writes(
        tmp_path: Path) -> None:
    manager, front, http = serve(tmp_path)
    try:
        # A new job is read back at once, though the copy has not heard of it yet.
        ids = []
        for i in range(10):
            ids.append(http.post("/v1/jobs", json={**small_job(), "name": f"j{i}"}).json()["id"])
            assert state_of(http, ids[-1]) == "PENDING"

        # Once the copy has caught up (changes come in order: the last job means all of
        # them), reads do not reach the job manager.
        kept = ids[-1]
        deadline = time.monotonic() + CHANGE_SEEN_S
        while True:
            before = CountingManager.reads
            body = http.get(f"/v1/jobs/{kept}")
            if CountingManager.reads == before or time.monotonic() > deadline:
                break
        for _ in range(200):
            assert http.get(f"/v1/jobs/{kept}").content == body.content
        assert CountingManager.reads == before

        # A write through this replica is read back at once, never from the older copy.
        for job_id in ids[:-1]:
            cancelled = http.delete(f"/v1/jobs/{job_id}").json()
            assert state_of(http, job_id) == cancelled["state"] == "CANCELLED"
        assert http.delete(f"/v1/jobs/{ids[0]}", params={"purge": "true"}).status_code == 200
        assert http.get(f"/v1/jobs/{ids[0]}").status_code == 404
        # ... and still need the token, and a query string still goes to the app's checks
        assert httpx.get(f"{http.base_url}/v1/jobs/{kept}").status_code == 401
        assert http.get(f"/v1/jobs/{kept}", params={"x": 1}).status_code == 422

        # A change made elsewhere (another replica's write, the scheduler) shows up.
        manager.cancel(kept)
        deadline = time.monotonic() + CHANGE_SEEN_S
        while state_of(http, kept) != "CANCELLED":
            assert time.monotonic() < deadline, "the copy never saw the change"
            time.sleep(0.05)
    finally:
        http.close()
        front.stop()
        manager.shutdown()


def test_a_status_read_after_a_streamed_end_is_never_older_than_the_end(
        tmp_path: Path) -> None:
    """A client that follows a job's events and reads its status once at the `end` gets
    the final state, though the copy hears of it a second later."""
    manager, front, http = serve(tmp_path, kind=SlowCopyManager)
    client = Client(str(http.base_url), token=http.headers["Authorization"].split()[-1])
    try:
        for i in range(3):
            ends_elsewhere(client, manager, f"ends-elsewhere-{i}", read_once_at_the_end)
    finally:
        client.close()
        http.close()
        front.stop()
        manager.shutdown()


def read_once_at_the_end(job: Job) -> JobStatus:
    for _ in job.events():  # to the `end`
        pass
    return job.status()


def ends_elsewhere(client: Client, manager: CountingManager, name: str,
                   final: Callable[[Job], JobStatus]) -> None:
    """Submit a job, wait until status reads of it come from the copy, then have the
    manager cancel it as the scheduler would: `final(job)` must say CANCELLED."""
    job = client.submit({**small_job(), "name": name})
    deadline = time.monotonic() + CHANGE_SEEN_S
    while True:  # until the copy has the job: reads no longer reach the manager
        before = CountingManager.reads
        job.status()
        if CountingManager.reads == before:
            break
        assert time.monotonic() < deadline, "the copy never heard of the job"
    threading.Timer(0.5, manager.cancel, (job.id,)).start()
    assert final(job).state == JobState.CANCELLED


class StreamsToOneReplica(httpx.HTTPTransport):
    """A load balancer that sends event streams to one replica and all else to another."""

    def __init__(self, stream_port: int, other_port: int) -> None:
        super().__init__()
        self.stream_port, self.other_port = stream_port, other_port

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        port = self.stream_port if request.url.path.endswith("/events") else self.other_port
        request.url = request.url.copy_with(port=port)
        return super().handle_request(request)


def test_wait_reads_the_end_through_a_replica_that_has_not_heard_of_it_yet(
        tmp_path: Path) -> None:
    """The stream on one replica, status reads on another, whose copy hears of the end a
    second after the stream: `Job.wait()` reads again until the status shows the end."""
    manager, front, http = serve(tmp_path, kind=SlowCopyManager)
    other = Front(build_app(InProcess(manager), cached_reads=1.0), "127.0.0.1", 0)
    ports = [server.sock.getsockname()[1] for server in (front, other)]
    client = Client(str(http.base_url), token=http.headers["Authorization"].split()[-1],
                    transport=StreamsToOneReplica(*ports))
    try:
        ends_elsewhere(client, manager, "read-elsewhere", Job.wait)
    finally:
        client.close()
        http.close()
        other.stop()
        front.stop()
        manager.shutdown()


def test_a_copy_is_replaced_whole_when_the_manager_is_a_new_one() -> None:
    cache = StatusCache(manager=None)
    job = '{"created_at": 1.0, "state": "PENDING"}'
    cache.apply({"epoch": "a", "version": 3, "full": True, "jobs": {"x": job, "y": job}})
    cache.apply({"epoch": "a", "version": 4, "full": False, "jobs": {"y": None}})
    assert set(cache.bodies) == set(cache.places) == {"x"}
    cache.apply({"epoch": "b", "version": 1, "full": True, "jobs": {"z": job}})
    assert cache.bodies == {"z": job.encode()} and (cache.epoch, cache.version) == ("b", 1)
    assert set(cache.places) == {"z"}


def test_replicas_share_the_port_and_it_stays_open_when_one_stops(tmp_path: Path) -> None:
    servers: list[tuple[Any, Front, httpx.Client]] = [serve(tmp_path / "a")]
    port = servers[0][1].sock.getsockname()[1]
    servers.append(serve(tmp_path / "b", port))
    try:
        seen = set()
        for _ in range(40):  # new connections each: the kernel spreads them over both
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/jobs", json=small_job(),
                                headers=servers[0][2].headers)
            seen.add(answer.status_code)  # 401 from b, whose tokens are its own
        # (b slows this address once it has refused it 20 times: 429 then)
        assert {202, 401} <= seen <= {202, 401, 429}
        servers[0][1].stop()
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
    finally:
        for manager, front, http in servers:
            http.close()
            front.stop()
            manager.shutdown()


def test_the_manager_answers_a_copy_with_just_what_changed_since_it_asked() -> None:
    versions = Versions()
    statuses = {"a": "A1", "b": "B1", "c": "C1"}
    for job_id in statuses:
        versions.touch(job_id)
    first = versions.changes(None, -1, statuses, statuses.get)
    assert first["full"] and first["jobs"] == statuses and first["version"] == 3
    versions.touch("a")  # a changes again: now the newest
    del statuses["b"]
    versions.touch("b")
    statuses["a"] = "A2"
    later = versions.changes(first["epoch"], 3, statuses, statuses.get)
    assert not later["full"] and later["jobs"] == {"a": "A2", "b": None}
    assert versions.changes(first["epoch"], 5, statuses, statuses.get)["jobs"] == {}
    assert not versions.changed(first["epoch"], 5) and versions.changed("another", 5)


class CountingLists(CountingManager):
    """Counts the list requests that reach the job manager."""

    lists = 0

    def list_jobs(self, limit: int | None = None, after: str | None = None,
                  states: list[str] | None = None) -> dict[str, Any]:
        CountingLists.lists += 1
        return super().list_jobs(limit, after, states)


def test_list_pages_come_from_memory_and_are_the_managers_own(tmp_path: Path) -> None:
    """Once the copy has caught up, every page of GET /v1/jobs (any limit, cursor and states)
    is what the job manager answers, headers and all, without asking it; a query the app
    must judge still reaches its checks, and a write is listed at once."""
    manager, front, http = serve(tmp_path, kind=CountingLists)
    try:
        ids = [http.post("/v1/jobs", json={**small_job(), "name": f"j{i}"}).json()["id"]
               for i in range(7)]
        for job_id in ids[:3]:
            http.delete(f"/v1/jobs/{job_id}")
        queries: list[dict[str, Any]] = [{}, {"limit": 2}, {"limit": 3, "state": "PENDING"},
                                         {"state": ["CANCELLED", "PENDING"], "limit": 1000}]

        def pages(query: dict[str, Any]) -> list[tuple[bytes, str | None, str | None]]:
            got, params = [], dict(query)
            while True:
                answer = http.get("/v1/jobs", params=params)
                assert answer.status_code == 200, answer.text
                got.append((answer.content, answer.headers.get("x-next-cursor"),
                            answer.headers.get("link")))
                if "x-next-cursor" not in answer.headers:
                    return got
                params = {**query, "after": answer.headers["x-next-cursor"]}

        deadline = time.monotonic() + CHANGE_SEEN_S
        while True:  # until the copy has caught up: a page no longer reaches the manager
            before = CountingLists.lists
            http.get("/v1/jobs")
            if CountingLists.lists == before or time.monotonic() > deadline:
                break
        before = CountingLists.lists
        from_memory = {repr(q): pages(q) for q in queries}
        assert CountingLists.lists == before  # none reached the manager
        expected = {}
        for query in queries:  # the manager's own pages
            got, after = [], None
            states = query.get("state", [])
            states = [states] if isinstance(states, str) else states
            while True:
                page = manager.list_jobs(query.get("limit", 100), after, states)
                got.append(page)
                if page["next"] is None:
                    break
                after = page["next"]
            expected[repr(query)] = got
        for query in queries:
            assert [c for c, _, _ in from_memory[repr(query)]] == \
                [p["jobs"].encode() for p in expected[repr(query)]], query
            assert [n for _, n, _ in from_memory[repr(query)]] == \
                [p["next"] for p in expected[repr(query)]], query
        assert len(from_memory[repr({"limit": 2})]) == 4  # 7 jobs, 2 a page
        # A query the app refuses still gets its 422, and a new job is listed at once.
        assert http.get("/v1/jobs", params={"limit": 0}).status_code == 422
        assert http.get("/v1/jobs", params={"state": "DONE"}).status_code == 422
        new = http.post("/v1/jobs", json=small_job()).json()["id"]
        assert new in [j["id"] for j in http.get("/v1/jobs").json()]
    finally:
        http.close()
        front.stop()
        manager.shutdown()
