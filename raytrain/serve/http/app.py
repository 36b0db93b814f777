"""The HTTP API: `build_app(manager_handle)` is the FastAPI app over any job manager handle
(the service's Ray actor, or `InProcess(manager)` in tests); serve.http.front's `RaytrainAPI` is the
Ray Serve deployment whose replicas build it over the service's job manager actor and serve it.

Bodies are validated by the same pydantic JobSpec as files; a bad one answers 422 with the
path of each bad field and nothing is queued. Every route is a thin call into the manager.

    POST /v1/jobs               queue a job (202)          GET  /v1/jobs          list
    GET  /v1/jobs/{id}          one job's status           DELETE /v1/jobs/{id}   cancel
    GET  /v1/jobs/{id}/events   Server-Sent Events         DELETE ...?purge=true  forget
    GET  /v1/jobs/{id}/logs     workers' output by rank    GET  /healthz, /readyz, /metrics

Every route but /healthz needs a bearer token (serve.http.auth; /metrics too unless opened), and
answers 401 without one before its body is read. Bodies over MAX_BODY_BYTES answer 413
unread, open event streams are limited (serve.http.limits), and an error never echoes more
than a short excerpt of what was sent. While the job manager cannot be reached, job
endpoints answer 503 with Retry-After rather than 500.
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' annotations to
# know a JobSpec is the body; real types need no resolving.
import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Annotated, Any, AsyncIterator
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from prometheus_client import Counter, Histogram
from pydantic import StringConstraints
from ray.exceptions import GetTimeoutError, RayActorError
from starlette.exceptions import HTTPException as StarletteHTTPException

from raytrain import __version__
from raytrain.catalog.hardware import CATALOG, Catalog
from raytrain.core.planner import NothingFits
from raytrain.core.resolve import rank_plans
from raytrain.errors import SpecError
from raytrain.serve.http.answers import add_refusals, manager_away, refused_submit
from raytrain.serve.http.auth import AuthPace, BearerAuth
from raytrain.serve.http.dashboard import ASSETS, PAGES, add_pages
from raytrain.serve.http.feeds import Feeds, ManagerAway
from raytrain.serve.http.limits import JSONBodies, SlotStream, StreamLimits
from raytrain.serve.http.metrics import (
    CONTENT_TYPE_OPENMETRICS,
    CONTENT_TYPE_PLAIN_0_0_4,
    RequestLatency,
    auth_refusals,
    exposition,
    request_latency,
)
from raytrain.serve.http.openapi import (
    RETRY_AFTER,
    allow_every_method,
    document,
    errors,
    event_stream,
    no_unknown_query,
)
from raytrain.serve.http.reads import LIST_PAGE_MAX, LIST_PAGE_SIZE, CachedReads, StatusCache
from raytrain.serve.jobs.history import STEPS_PER_ANSWER
from raytrain.spec import (
    ExportAnswer,
    ExportRequest,
    JobHistory,
    JobLogs,
    JobSpec,
    JobState,
    JobStatus,
    OffersRequest,
    OffersResponse,
    PlanRequest,
    PlanResponse,
    ResumeRequest,
)
from raytrain.spec.files import snapshot

APP_NAME = "raytrain"
SHIPPED_OFFERS = snapshot().offers  # the shapes POST /v1/plans may name by offer
EVENT_POLL_S = 10.0
READY_TIMEOUT_S = 5.0
LOG_BYTES_PER_RANK = 64 * 2**10

logger = logging.getLogger(__name__)
RankOffset = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}:[0-9]{1,18}$")]


def _caller(request: Request) -> str | None:
    """The name of the token the request came with (None on an open service)."""
    return getattr(request.state, "caller", None)


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"no job with id {job_id!r}")


def _json(text: str, headers: dict[str, str] | None = None) -> Response:
    """An answer the job manager encoded already (statuses: encoded once per change, not
    validated and encoded again per read)."""
    return Response(text, media_type="application/json", headers=headers)


def build_app(manager: Any, open_metrics: bool = False, auth: bool = True,
              cached_reads: float | None = None, hardware: Catalog = CATALOG,
              auth_pace: AuthPace = AuthPace()) -> FastAPI:
    """The HTTP API over a job manager handle: a Ray actor handle, or `InProcess(manager)`
    for a manager in this process (tests drive the app through httpx's ASGITransport).
    open_metrics: serve /metrics without a token. auth: whether the service asks for tokens
    (the manager's config decides; /healthz says so, for the dashboard's sign-in).
    cached_reads: answer status reads from a copy kept by a long-poll of this many seconds
    (serve.http.reads; for a server whose event loop lives as long as the app)."""
    cache = StatusCache(manager, cached_reads) if cached_reads else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if cache is not None:
            await cache.close()

    api = FastAPI(
        lifespan=lifespan,
        title="raytrain",
        version=__version__,
        description="Train PyTorch models across many GPUs as cheaply as possible.",
        dependencies=[Depends(no_unknown_query)],
        docs_url=None, redoc_url=None,  # serve.dashboard serves them, with no CDN
    )
    open_paths = frozenset({"/healthz", "/readyz", *(["/metrics"] if open_metrics else [])})
    document(api, open_paths)
    add_pages(api)
    latency = request_latency()
    refused = auth_refusals()
    streams = StreamLimits()
    feeds = Feeds(manager, EVENT_POLL_S,
                  on_change=cache.heard_of_change if cache is not None else None)
    api.add_exception_handler(RequestValidationError, refused_submit(manager))
    api.add_exception_handler(StarletteHTTPException, allow_every_method)
    api.add_exception_handler(RayActorError, manager_away)
    api.add_exception_handler(GetTimeoutError, manager_away)
    add_refusals(api)

    job_routes(api, manager)
    output_routes(api, manager)
    event_routes(api, manager, feeds, streams)
    planning_routes(api, manager, hardware)
    probe_routes(api, manager, auth, latency, refused)

    api.add_middleware(JSONBodies)
    if cache is not None:
        api.add_middleware(CachedReads, cache=cache, route=get_job_route(api),
                           list_route=route_of(api, "/v1/jobs", "GET"))
    # Added after the above, so it runs before them: a request without a token is refused
    # before its body is read, and before any answer from memory.
    api.add_middleware(BearerAuth, digests=lambda: manager.token_digests.remote(),
                       open_paths=open_paths | PAGES, open_prefixes=(ASSETS,), refused=refused,
                       pace=auth_pace)
    api.add_middleware(RequestLatency, histogram=latency)  # outermost: times a 401 too
    return api


def job_routes(api: FastAPI, manager: Any) -> None:
    """Submit, list, read, cancel, resume and delete jobs."""
    @api.post("/v1/jobs", status_code=202, response_model=JobStatus,
              responses=errors(400, 409, 413, 422, 429))
    async def submit(spec: JobSpec, request: Request, idempotency_key: str = Header(
            None, max_length=200, description="Retrying with the same key returns the job the "
            "first request queued (for a day) instead of queueing another.")
                     ) -> dict[str, Any]:
        return await manager.submit.remote(spec, _caller(request), idempotency_key)

    @api.get("/v1/jobs", response_model=list[JobStatus], responses=errors(422))
    async def list_jobs(
        limit: int = Query(LIST_PAGE_SIZE, ge=1, le=LIST_PAGE_MAX, description="Jobs per page."),
        after: str | None = Query(None, max_length=64, description="The cursor the previous "
                                  "page gave in its X-Next-Cursor header."),
        state: list[JobState] = Query([], description="Only jobs in these states."),
    ) -> Response:
        """Jobs oldest first, a page at a time: when more follow, the `X-Next-Cursor` header
        (and a `Link: <...>; rel="next"` header) says where the next page starts."""
        page = await manager.list_jobs.remote(limit, after, [s.value for s in state])
        headers = {}
        if page["next"] is not None:
            headers["X-Next-Cursor"] = page["next"]
            query = urlencode([("limit", limit), ("after", page["next"]),
                               *[("state", s.value) for s in state]])
            headers["Link"] = f'</v1/jobs?{query}>; rel="next"'
        return _json(page["jobs"], headers)

    @api.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=errors(404, 422))
    async def get_job(job_id: str) -> Response:
        job = await manager.get_job.remote(job_id)
        if job is None:
            raise _not_found(job_id)
        return _json(job)

    @api.delete("/v1/jobs/{job_id}", response_model=JobStatus,
                responses=errors(404, 409, 422))
    async def cancel(job_id: str, request: Request, purge: bool = Query(
            False, description="Forget an ended job instead: its record, checkpoints and "
            "logs (409 while it runs)")) -> dict[str, Any]:
        """Cancel a job; with `?purge=true`, delete an ended one."""
        if purge:
            return await manager.delete.remote(job_id)
        return await manager.cancel.remote(job_id, _caller(request))

    @api.post("/v1/jobs/{job_id}/resume", status_code=202, response_model=JobStatus,
              responses=errors(400, 404, 409, 413, 422, 429))
    async def resume(job_id: str, body: ResumeRequest, request: Request,
                     idempotency_key: str = Header(None, max_length=200)) -> Any:
        """Queue a new job that goes on from a failed or cancelled job's latest checkpoint
        (a job stopped by its budget, say), with its own budget if given."""
        return await manager.resume.remote(job_id, _caller(request), body.budget_usd,
                                           idempotency_key)


    @api.post("/v1/jobs/{job_id}/export", response_model=ExportAnswer,
              responses=errors(404, 409, 422))
    async def export(job_id: str, body: ExportRequest) -> Any:
        """Write a kind 'hf' job's committed checkpoint (the latest, or `step`'s) as a
        Hugging Face folder in the job's storage, `exports/step_<N>`, whatever layout trained
        it; answers once it is written (the model is built in the job manager's process)."""
        return await manager.export.remote(job_id, body.step, body.merge, body.dtype)


def output_routes(api: FastAPI, manager: Any) -> None:
    """What a job left: its progress history and its workers' output."""
    @api.get("/v1/jobs/{job_id}/history", response_model=JobHistory,
             responses=errors(404, 422))
    async def history(job_id: str,
                      after_step: int = Query(-1, ge=-1, description="Step rows after this "
                                              "step only (the `next_after_step` of the "
                                              "previous answer)"),
                      max_steps: int = Query(STEPS_PER_ANSWER, ge=1, le=STEPS_PER_ANSWER,
                                             description="Step rows in this answer, at most")
                      ) -> Response:
        """The job's progress reports for charts (step, loss, tokens/s, dollars), oldest
        first, kept across service restarts and thinned evenly past `points_kept`; and every
        optimizer step's loss, learning rate, gradient norm and tokens, by step, in pages."""
        points = await manager.history.remote(job_id, after_step, max_steps)
        if points is None:
            raise _not_found(job_id)
        return _json(points)

    @api.get("/v1/jobs/{job_id}/logs", response_model=JobLogs, responses=errors(404, 422))
    async def logs(job_id: str, rank: int | None = Query(None, ge=0, le=100_000),
                   offset: list[RankOffset] = Query(
                       [], description="RANK:BYTE pairs, e.g. 0:1024: read each rank from "
                       "there (the `offset` of the previous answer); default: each rank's "
                       "tail"),
                   max_bytes: int = Query(LOG_BYTES_PER_RANK, ge=1, le=LOG_BYTES_PER_RANK)
                   ) -> dict[str, Any]:
        """Each worker's output by rank, at most max_bytes per rank per answer."""
        offsets = {int(r): int(byte) for r, _, byte in (p.partition(":") for p in offset)}
        return await manager.logs.remote(job_id, offsets or None, rank, max_bytes)


def event_routes(api: FastAPI, manager: Any, feeds: Feeds, streams: StreamLimits) -> None:
    """Each job's event stream (Server-Sent Events), one slot per stream."""
    @api.get("/v1/jobs/{job_id}/events", response_class=StreamingResponse,
             responses=event_stream())
    async def events(job_id: str, after: int = Query(
            -1, ge=-1, le=2**53, description="Send the events after this one (-1: from the "
            "start); the Last-Event-ID header wins when both are sent."),
            last_event_id: int = Header(  # optional, but never
                None, ge=-1, le=2**53,  # null: a header cannot be (the document says integer)
                description="The id of the last event received, to resume.")
            ) -> StreamingResponse:
        """Server-Sent Events: `state`, `progress`, `checkpoint`, then one `end`.

        Resumes after the `Last-Event-ID` header (or `?after=`) when given."""
        if last_event_id is not None:
            after = last_event_id
        if await manager.get_job.remote(job_id) is None:
            raise _not_found(job_id)
        release = streams.admit(job_id)  # given back when the response ends, however

        async def stream() -> AsyncIterator[str]:
            nonlocal after
            try:
                async with feeds.follow(job_id) as feed:
                    while True:
                        batch = await feed.after(after, EVENT_POLL_S)
                        if batch is None:
                            return
                        if not batch:
                            yield ": keep-alive\n\n"
                            continue
                        for sent in batch:
                            after = sent.seq
                            yield sent.text
                            if sent.type == "end":
                                return
            except asyncio.CancelledError:
                return  # the client went away: nothing to report
            except ManagerAway:
                yield ": the job manager went away; reconnect with Last-Event-ID\n\n"

        return SlotStream(stream(), release, media_type="text/event-stream")


def planning_routes(api: FastAPI, manager: Any, hardware: Catalog) -> None:
    """Plans (on `hardware`: this machine's CPU profile, if calibrated) and offers: nothing
    submitted."""
    @api.post("/v1/plans", response_model=PlanResponse, responses=errors(400, 413, 422))
    async def plans(request: PlanRequest) -> PlanResponse:
        """Rank every feasible layout of the job on the hardware asked about, or evaluate the
        one layout the request gives, on its node shape."""
        try:
            return rank_plans(request, SHIPPED_OFFERS, hardware)
        except NothingFits as exc:
            raise HTTPException(status_code=422, detail=[{
                "loc": ["body", "spec", "parallel"], "msg": str(exc),
                "type": "nothing_fits", "suggestions": exc.suggestions,
            }]) from None
        except SpecError as exc:  # a layout or shape that cannot work
            raise HTTPException(status_code=422, detail=[
                {**e.to_json(), "loc": ["body", *e.loc]} for e in exc.errors]) from None

    @api.get("/v1/offers", response_model=OffersResponse, responses=errors(404, 422))
    async def offers(job: str | None = None, policy: str | None = None,
                     keep: int = 20) -> dict[str, Any]:
        """The instance offers with current prices; with `?job=ID`, the policy's ranking of
        offer x market x node count for that job."""
        return await manager.offers.remote(None, policy, keep, job)

    @api.post("/v1/offers", response_model=OffersResponse,
              responses=errors(400, 413, 422))
    async def rank_offers(request: OffersRequest) -> dict[str, Any]:
        """The policy's ranking for a job spec, nothing submitted."""
        return await manager.offers.remote(request.spec, request.policy, request.keep)


def probe_routes(api: FastAPI, manager: Any, auth: bool, latency: Histogram, refused: Counter
                 ) -> None:
    """Liveness, readiness and metrics: open to probes (metrics as configured)."""
    @api.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Liveness: this process answers. Readiness is /readyz. `auth`: whether the other
        endpoints need a token."""
        return {"status": "ok", "version": __version__, "auth": auth}

    @api.get("/readyz", responses={**errors(), 503: {
        "description": "Starting, or the job manager or its store is not answering.",
        "headers": RETRY_AFTER}})
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: the job manager answers and its store takes writes. Open, for probes:
        without a token it says only whether the service is ready; with one, why not, and
        where its store is."""
        try:
            ready = await asyncio.wait_for(manager.ready.remote(), READY_TIMEOUT_S)
        except (asyncio.TimeoutError, RayActorError, GetTimeoutError) as exc:
            ready = {"ready": False, "status": "starting", "detail": type(exc).__name__}
        if auth and _caller(request) is None:
            ready = {"ready": ready["ready"], "status": "ready" if ready["ready"] else
                     "not ready (send a token for the reason)"}
        return JSONResponse(status_code=200 if ready["ready"] else 503,
                            content={**ready, "version": __version__},
                            headers={} if ready["ready"] else {"Retry-After": "2"})

    @api.get("/metrics", response_class=Response, responses={**errors(), 200: {
        "content": {CONTENT_TYPE_PLAIN_0_0_4: {"schema": {"type": "string"}},
                    CONTENT_TYPE_OPENMETRICS: {"schema": {"type": "string"}}},
        "description": "Prometheus text format: counters, histograms, and each job's series "
                       "while active and for ServiceConfig.metrics_retention_s after."}})
    async def metrics(request: Request) -> Response:
        body, content_type = exposition(await manager.metrics.remote(), latency,
                                        request.headers.get("accept"), refused)
        return Response(body, media_type=content_type)


def get_job_route(api: FastAPI) -> Any:
    return route_of(api, "/v1/jobs/{job_id}", "GET")


def route_of(api: FastAPI, path: str, method: str) -> Any:
    return next(route for route in api.routes if getattr(route, "path", None) == path
                and method in getattr(route, "methods", ()))


class InProcess:
    """A job manager in this process, called like a Ray actor handle:
    `await InProcess(manager).get_job.remote(job_id)` runs the method on a worker thread."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._manager, name)

        class _Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                return asyncio.to_thread(method, *args)

        return _Method
