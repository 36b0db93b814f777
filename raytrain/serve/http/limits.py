"""The API's limits that are not part of any schema: request bodies (413 before they are
read, and every body read as JSON whatever its Content-Type says) and open event streams
(429 past MAX_STREAMS_PER_JOB on one job, MAX_STREAMS in all, or MAX_FOLLOWED_JOBS jobs
followed at once: each stream holds a connection, and each followed job one waiting call into
the job manager, whose threads are bounded; serve.http.feeds). Events kept per job are
bounded by the job manager's EventLog (serve.jobs.event_log); spec fields by their schema
bounds; queued and running jobs by ServiceConfig.max_active_jobs (serve.jobs.admission).

Written as ASGI middleware and a counter because a size limit must hold before FastAPI
reads the body, and Starlette has no stream count.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from fastapi import HTTPException
from fastapi.responses import StreamingResponse

from raytrain.serve.http.auth import send_json

MAX_BODY_BYTES = 1 * 2**20  # a job spec is a few KB; the schema has no field near this
MAX_HEAD_BYTES = 64 * 1024  # a request's line and headers (serve.http.front.BoundedHead: 431)
MAX_HEADERS = 100
MAX_READ_AHEAD = 256 * 1024  # one read may hold a body's start besides the head
MAX_STREAMS_PER_JOB = 64
MAX_STREAMS = 256
MAX_FOLLOWED_JOBS = 32  # of the job manager's 64 threads
STREAM_RETRY_AFTER_S = 10


class JSONBodies:
    """Read every request body as JSON, whatever its Content-Type says, and refuse one over
    MAX_BODY_BYTES with 413 before reading it.

    The API takes only JSON, and `curl -d @job.json` (the shortest way to submit) labels its
    body form-encoded, which FastAPI would hand to the JobSpec model as raw bytes.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
        scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _too_large(send)
            return
        # The whole body, read here (at most MAX_BODY_BYTES of it), so that one sent in
        # chunks without a length is refused with the same 413 before the app sees any.
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away mid-body
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                await _too_large(send)
                return
        replayed = False

        async def whole() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            # then what follows the body: the client's disconnect
            message: dict[str, Any] = await receive()
            return message

        await self.app(scope, whole, send)


async def _too_large(send: Any) -> None:
    await send_json(send, 413, f"the request body is over the {MAX_BODY_BYTES // 2**20} MiB "
                    "limit. To fix: send a job spec (a few KB); large data belongs in a token "
                    "file the workers read")


class StreamLimits:
    """Open event streams, per job and in all."""

    def __init__(self, per_job: int = MAX_STREAMS_PER_JOB, total: int = MAX_STREAMS,
                 jobs: int = MAX_FOLLOWED_JOBS) -> None:
        self.per_job, self.total, self.jobs = per_job, total, jobs
        self.open: Counter[str] = Counter()

    def admit(self, job_id: str) -> Callable[[], None]:
        """Take a slot for one more stream on the job, or raise 429 when it would pass a
        limit. Checking and taking are one step (nothing awaits between), so concurrent
        requests cannot overrun a limit; the returned function gives the slot back (once,
        however often it is called), and must be called however the stream ends."""
        which = (f"{self.per_job} on this job" if self.open[job_id] >= self.per_job
                 else f"{self.total} on this service" if sum(self.open.values()) >= self.total
                 else f"{self.jobs} jobs followed at once" if job_id not in self.open
                 and len(self.open) >= self.jobs else None)
        if which is not None:
            raise HTTPException(status_code=429, headers={
                "Retry-After": str(STREAM_RETRY_AFTER_S)}, detail=(
                f"too many open event streams ({which}). To fix: close streams you no longer "
                "read, or poll GET /v1/jobs/{id} instead"))
        self.open[job_id] += 1
        given_back = False

        def release() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self.open[job_id] -= 1
                if not self.open[job_id]:
                    del self.open[job_id]

        return release

    @contextmanager
    def held(self, job_id: str) -> Iterator[None]:
        """A slot for the length of a block (admit, then release at its end)."""
        release = self.admit(job_id)
        try:
            yield
        finally:
            release()


class SlotStream(StreamingResponse):
    """An event stream that gives its slot back however it ends: finished, the client gone,
    or never started (the client left before the response began)."""

    def __init__(self, content: Any, release: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
