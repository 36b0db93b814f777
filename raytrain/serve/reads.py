"""Job status reads answered from the HTTP replica's memory.

Status reads are most of the traffic (the CLI, the Python client and the dashboard poll) and a
read through the job manager is an actor call, which costs both processes more CPU than the
request itself. Each replica keeps every job's status as the manager encoded it, brought up to
date by one long-poll (`JobManager.changes`): the manager answers as soon as any status
changes, with just the statuses that did.

    cache = StatusCache(manager)
    app.add_middleware(CachedReads, cache=cache, route=the GET /v1/jobs/{job_id} route)

A read is answered from memory only while the copy is known to hold every write this replica
has carried out, and every change its event streams have sent: while a write is under way,
and until a poll issued after it (or after the event) has come back, reads go to the job
manager as before. So a client reads its own writes on its connection, and a status read
after a stream's `state`, `checkpoint` or `end` event is at least as new as the event.
Through another replica a read trails a write by the time a change takes to reach it (one
long-poll answer, milliseconds). Anything the copy cannot answer (an unknown id, a query
string, the manager away) goes on to the app, which asks the manager.

Written here because no caching layer in Starlette or Ray Serve is told when the job manager's
statuses change.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import contextmanager
from itertools import takewhile
from typing import Any, Callable, Iterator, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

POLL_S = 10.0
RETRY_S = 1.0
JOBS = "/v1/jobs/"

logger = logging.getLogger(__name__)


class Versions:
    """The job manager's side: a version number for every status change, so a replica's copy
    can ask for what changed after the version it holds."""

    def __init__(self) -> None:
        self.epoch = uuid.uuid4().hex  # this manager instance: a restarted one starts again
        self.version = 0
        # each job's latest change (deletion too), oldest first: a poll reads back from the
        # newest only as far as the version it holds
        self._changed_at: dict[str, int] = {}

    def touch(self, job_id: str) -> None:
        self.version += 1
        self._changed_at.pop(job_id, None)
        self._changed_at[job_id] = self.version

    def changed(self, epoch: str | None, since: int) -> bool:
        return epoch != self.epoch or self.version > since

    def changes(self, epoch: str | None, since: int, jobs: Mapping[str, Any],
                encoded: Callable[[str], str]) -> dict[str, Any]:
        """The statuses changed after version `since` ({job id: encoded(job id), or None for
        a job no longer in `jobs`}); all of `jobs` (`full`) when `epoch` is not this
        instance's: a copy's first call, or its first after the manager restarted."""
        full = epoch != self.epoch
        changed = jobs if full else list(takewhile(
            lambda job_id: self._changed_at[job_id] > since, reversed(self._changed_at)))
        return {"epoch": self.epoch, "version": self.version, "full": full,
                "jobs": {job_id: encoded(job_id) if job_id in jobs else None
                         for job_id in changed}}


class StatusCache:
    """Every job's status JSON, kept up to date from the job manager by one long-poll."""

    def __init__(self, manager: Any, poll_s: float = POLL_S) -> None:
        self.manager = manager
        self.poll_s = poll_s
        self.bodies: dict[str, bytes] = {}
        self.epoch: str | None = None  # the manager instance the copy came from
        self.version = -1
        # changes the copy must hold: writes finished here, and what this replica's event
        # streams sent
        self._known = 0
        self._under_way = 0
        self._covered = -1  # the changes the last poll's answer is known to include
        self._task: asyncio.Task | None = None

    def get(self, job_id: str) -> bytes | None:
        """The job's status, or None when the copy cannot be trusted to have it."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._pump())
        if self.epoch is None or self._under_way or self._covered != self._known:
            return None
        return self.bodies.get(job_id)

    @contextmanager
    def write(self) -> Iterator[None]:
        """Around a request that may change a job: reads go to the manager until a poll
        issued after it has answered."""
        self._under_way += 1
        try:
            yield
        finally:
            self._under_way -= 1
            self.heard_of_change()

    def heard_of_change(self) -> None:
        """A change this replica learnt of otherwise than by a poll (an event stream's): reads
        go to the manager until a poll issued after it has answered."""
        self._known += 1

    async def _pump(self) -> None:
        while True:
            covers = self._known
            wait_s = self.poll_s if self._covered == covers else 0.0
            try:
                self.apply(await self.manager.changes.remote(self.epoch, self.version, wait_s))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the manager away: reads go to the app, which says 503
                logger.info("status copy paused: %s", type(exc).__name__)
                self.epoch = None
                await asyncio.sleep(RETRY_S)
                continue
            self._covered = covers

    def apply(self, answer: dict[str, Any]) -> None:
        """Take a `JobManager.changes` answer."""
        if answer["full"]:
            self.bodies = {}
        for job_id, text in answer["jobs"].items():
            if text is None:
                self.bodies.pop(job_id, None)
            else:
                self.bodies[job_id] = text.encode()
        self.epoch, self.version = answer["epoch"], answer["version"]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class CachedReads:
    """ASGI middleware: GET /v1/jobs/{id} from the StatusCache when it has the job; every
    other request goes on to the app, counted as a write unless it is a GET or HEAD."""

    def __init__(self, app: ASGIApp, cache: StatusCache, route: Any) -> None:
        self.app = app
        self.cache = cache
        self.route = route  # what the latency histogram labels the answer with

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        if method == "GET":
            path: str = scope["path"]
            if path.startswith(JOBS) and "/" not in path[len(JOBS):] and \
                    not scope["query_string"]:
                body = self.cache.get(path[len(JOBS):])
                if body is not None:
                    scope["route"] = self.route
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
            await self.app(scope, receive, send)
        elif method == "HEAD":
            await self.app(scope, receive, send)
        else:
            with self.cache.write():
                await self.app(scope, receive, send)
