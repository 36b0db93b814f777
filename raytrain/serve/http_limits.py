"""The API's limits that are not part of any schema: request bodies (413 before they are
read, and every body read as JSON whatever its Content-Type says) and open event streams
(429 past MAX_STREAMS_PER_JOB on one job, MAX_STREAMS in all, or MAX_FOLLOWED_JOBS jobs
followed at once: each stream holds a connection, and each followed job one waiting call into
the job manager, whose threads are bounded; serve.feeds). Events kept per job are bounded by the
job manager's EventLog (serve.events); spec fields by their schema bounds; queued and running
jobs by ServiceConfig.max_active_jobs (serve.admission).

Written as ASGI middleware and a counter because a size limit must hold before FastAPI
reads the body, and Starlette has no stream count.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

from fastapi import HTTPException

from raytrain.serve.auth import send_json

MAX_BODY_BYTES = 1 * 2**20  # a job spec is a few KB; the schema has no field near this
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

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
        scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _too_large(send)
            return
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > MAX_BODY_BYTES:  # a chunked body that did not say its length
                raise _BodyTooLarge()
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await _too_large(send)


class _BodyTooLarge(Exception):
    pass


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

    def admit(self, job_id: str) -> None:
        """Raise 429 when another stream would pass a limit."""
        which = (f"{self.per_job} on this job" if self.open[job_id] >= self.per_job
                 else f"{self.total} on this service" if sum(self.open.values()) >= self.total
                 else f"{self.jobs} jobs followed at once" if job_id not in self.open
                 and len(self.open) >= self.jobs else None)
        if which is not None:
            raise HTTPException(status_code=429, headers={
                "Retry-After": str(STREAM_RETRY_AFTER_S)}, detail=(
                f"too many open event streams ({which}). To fix: close streams you no longer "
                "read, or poll GET /v1/jobs/{id} instead"))

    @contextmanager
    def held(self, job_id: str) -> Iterator[None]:
        self.open[job_id] += 1
        try:
            yield
        finally:
            self.open[job_id] -= 1
            if not self.open[job_id]:
                del self.open[job_id]
