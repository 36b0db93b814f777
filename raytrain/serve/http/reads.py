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
import json
import logging
from contextlib import contextmanager
from typing import Any, Iterator
from urllib.parse import parse_qsl, urlencode

from starlette.types import ASGIApp, Receive, Scope, Send

from raytrain.serve.jobs.versions import list_cursor

POLL_S = 10.0
RETRY_S = 1.0
JOBS = "/v1/jobs/"
LIST = "/v1/jobs"
LIST_PAGE_SIZE = 100  # GET /v1/jobs: jobs per page by default, and at most
LIST_PAGE_MAX = 1000
PAGES_KEPT = 64  # list pages kept between changes
STATES = frozenset({"PENDING", "PROVISIONING", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED",
                    "CANCELLED"})


logger = logging.getLogger(__name__)


class StatusCache:
    """Every job's status JSON, kept up to date from the job manager by one long-poll."""

    def __init__(self, manager: Any, poll_s: float = POLL_S) -> None:
        self.manager = manager
        self.poll_s = poll_s
        self.bodies: dict[str, bytes] = {}
        self.places: dict[str, tuple[str, str]] = {}  # each job's (list cursor, state)
        self._order: list[str] | None = None  # the job ids by cursor; None: to sort again
        # pages answered since the last change: (limit, after, states) -> page
        self._pages: dict[tuple[int, str | None, frozenset[str]],
                          tuple[bytes, str | None]] = {}
        self.epoch: str | None = None  # the manager instance the copy came from
        self.version = -1
        # changes the copy must hold: writes finished here, and what this replica's event
        # streams sent
        self._known = 0
        self._under_way = 0
        self._covered = -1  # the changes the last poll's answer is known to include
        self._task: asyncio.Task[None] | None = None

    def _trusted(self) -> bool:
        """Whether the copy holds every change this replica knows of (the long-poll started
        on the first read)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._pump())
        return not (self.epoch is None or self._under_way or self._covered != self._known)

    def get(self, job_id: str) -> bytes | None:
        """The job's status, or None when the copy cannot be trusted to have it."""
        return self.bodies.get(job_id) if self._trusted() else None

    def page(self, limit: int, after: str | None, states: frozenset[str]
             ) -> tuple[bytes, str | None] | None:
        """A page of GET /v1/jobs as the job manager would answer it (the JSON array, and the
        next page's cursor), or None when the copy cannot be trusted (as `get`)."""
        if not self._trusted():
            return None
        key = (limit, after, states)
        if key in self._pages:  # the dashboard and scripts poll the same page
            return self._pages[key]
        if self._order is None:
            self._order = sorted(self.places, key=lambda job_id: self.places[job_id][0])
        found = [job_id for job_id in self._order
                 if (not states or self.places[job_id][1] in states)
                 and (not after or self.places[job_id][0] > after)]
        page = found[:limit]
        body = b"[" + b",".join(self.bodies[job_id] for job_id in page) + b"]"
        if len(self._pages) >= PAGES_KEPT:
            self._pages.clear()
        self._pages[key] = body, self.places[page[-1]][0] if len(found) > limit else None
        return self._pages[key]

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
            except Exception as exc:  # noqa: BLE001 - the manager away: the app says 503
                logger.info("status copy paused: %s", type(exc).__name__)
                self.epoch = None
                await asyncio.sleep(RETRY_S)
                continue
            self._covered = covers

    def apply(self, answer: dict[str, Any]) -> None:
        """Take a `JobManager.changes` answer."""
        self._pages.clear()
        if answer["full"]:
            self.bodies, self.places, self._order = {}, {}, None
        for job_id, text in answer["jobs"].items():
            if text is None:
                self.bodies.pop(job_id, None)
                self.places.pop(job_id, None)
                self._order = None
            else:
                self.bodies[job_id] = text.encode()
                status = json.loads(text)
                if job_id not in self.places:
                    self._order = None
                self.places[job_id] = (list_cursor(status["created_at"], job_id),
                                       status["state"])
        self.epoch, self.version = answer["epoch"], answer["version"]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


class CachedReads:
    """ASGI middleware: GET /v1/jobs/{id} and GET /v1/jobs (its pages) from the StatusCache
    when it can answer; every other request goes on to the app, counted as a write unless it
    is a GET or HEAD."""

    def __init__(self, app: ASGIApp, cache: StatusCache, route: Any,
                 list_route: Any = None) -> None:
        self.app = app
        self.cache = cache
        self.route = route  # what the latency histogram labels the answer with
        self.list_route = list_route

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
                    await _answer(send, body)
                    return
            elif path == LIST and self.list_route is not None:
                answered = self._page(scope["query_string"])
                if answered is not None:
                    scope["route"] = self.list_route
                    await _answer(send, *answered)
                    return
            await self.app(scope, receive, send)
        elif method == "HEAD":
            await self.app(scope, receive, send)
        else:
            with self.cache.write():
                await self.app(scope, receive, send)

    def _page(self, query: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]] | None:
        """A list page from the copy, with its paging headers; None for a query the app
        must judge (anything it would refuse, or anything unusual) or a copy not trusted."""
        try:
            pairs = parse_qsl(query.decode("ascii"), keep_blank_values=True,
                              strict_parsing=bool(query))
        except (UnicodeDecodeError, ValueError):
            return None
        limit, after, states = LIST_PAGE_SIZE, None, []
        for key, value in pairs:
            if key == "limit" and value.isdigit() and len(value) <= 4 and \
                    1 <= int(value) <= LIST_PAGE_MAX:
                limit = int(value)
            elif key == "after" and 0 < len(value) <= 64 and after is None:
                after = value
            elif key == "state" and value in STATES:
                states.append(value)
            else:
                return None
        found = self.cache.page(limit, after, frozenset(states))
        if found is None:
            return None
        body, cursor = found
        headers = []
        if cursor is not None:
            link = urlencode([("limit", limit), ("after", cursor),
                              *[("state", state) for state in states]])
            headers = [(b"x-next-cursor", cursor.encode()),
                       (b"link", f'</v1/jobs?{link}>; rel="next"'.encode())]
        return body, headers


async def _answer(send: Send, body: bytes,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})
