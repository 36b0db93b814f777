"""The HTTP API: a Ray Serve deployment with a FastAPI ingress over the job manager actor.

Bodies are validated by the same pydantic JobSpec as files; a bad one answers 422 with the
path of each bad field and nothing is queued. Every route is a thin call into the manager.

    POST /v1/jobs               queue a job (202)          GET  /v1/jobs          list
    GET  /v1/jobs/{id}          one job's status           DELETE /v1/jobs/{id}   cancel
    GET  /v1/jobs/{id}/events   Server-Sent Events         GET  /healthz, /metrics
"""

# No `from __future__ import annotations` here: FastAPI must see real types on the ingress
# methods, and Serve's class wrapping keeps it from resolving string annotations (a JobSpec
# body would turn into a required query parameter).
import json
from typing import Any, AsyncIterator

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from ray import serve

from raytrain import __version__
from raytrain.core.planner import NothingFits
from raytrain.spec import (
    JobSpec,
    JobState,
    JobStatus,
    OffersRequest,
    OffersResponse,
    PlanRequest,
    PlanResponse,
    ServiceConfig,
    rank_plans,
)

APP_NAME = "raytrain"
EVENT_POLL_S = 10.0

api = FastAPI(
    title="raytrain",
    version=__version__,
    description="Train PyTorch models across many GPUs as cheaply as possible.",
)


class JSONBodies:
    """Read every request body as JSON, whatever its Content-Type says.

    The API takes only JSON, and `curl -d @job.json` (the shortest way to submit) labels its
    body form-encoded, which FastAPI would hand to the JobSpec model as raw bytes.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "PATCH"):
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


api.add_middleware(JSONBodies)


def _unwrap(envelope: dict[str, Any]) -> Any:
    if "ok" in envelope:
        return envelope["ok"]
    kind, detail = envelope["error"], envelope["detail"]
    if kind == "spec":
        raise HTTPException(status_code=422,
                            detail=[{**e, "loc": ["body", *e["loc"]]} for e in detail])
    if kind == "not_found":
        raise HTTPException(status_code=404, detail=detail)
    raise HTTPException(status_code=409, detail=detail)


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"no job with id {job_id!r}")


def _sse(event: dict[str, Any]) -> str:
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"


def render_metrics(jobs: list[JobStatus]) -> str:
    """Prometheus text exposition of job counts and each active job's progress."""
    lines = [
        "# HELP raytrain_jobs Jobs by state.",
        "# TYPE raytrain_jobs gauge",
    ]
    for state in JobState:
        count = sum(1 for job in jobs if job.state == state)
        lines.append(f'raytrain_jobs{{state="{state.value}"}} {count}')
    gauges = {
        "raytrain_job_step": ("Optimizer steps completed.", lambda j: j.progress.step),
        "raytrain_job_loss": ("Latest training loss.", lambda j: j.progress.loss),
        "raytrain_job_tokens_per_second": ("Recent throughput.", lambda j: j.progress.tokens_per_s),
        "raytrain_job_cost_usd": ("Dollars spent so far.", lambda j: j.cost_usd),
        "raytrain_job_restarts": ("Restarts from a checkpoint.", lambda j: j.restarts),
    }
    for name, (help_text, read) in gauges.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for job in jobs:
            value = read(job)
            if value is not None and not job.state.is_terminal:
                lines.append(f'{name}{{job="{job.id}",name="{job.spec.name}"}} {value}')
    return "\n".join(lines) + "\n"


# Helpers the deployment calls are defined above it: Serve ships the class by value.
@serve.deployment(
    name="RaytrainAPI",
    logging_config={"log_level": "WARNING", "enable_access_log": False},
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=64,
)
@serve.ingress(api)
class RaytrainAPI:
    def __init__(self, config: dict[str, Any]) -> None:
        from raytrain.serve.manager import get_or_create_manager

        self.manager = get_or_create_manager(ServiceConfig.model_validate(config))

    @api.post("/v1/jobs", status_code=202, response_model=JobStatus)
    async def submit(self, spec: JobSpec) -> dict[str, Any]:
        return _unwrap(await self.manager.submit.remote(spec.model_dump(mode="json")))

    @api.get("/v1/jobs", response_model=list[JobStatus])
    async def list_jobs(self) -> list[dict[str, Any]]:
        return await self.manager.list_jobs.remote()

    @api.get("/v1/jobs/{job_id}", response_model=JobStatus)
    async def get_job(self, job_id: str) -> dict[str, Any]:
        job = await self.manager.get_job.remote(job_id)
        if job is None:
            raise _not_found(job_id)
        return job

    @api.delete("/v1/jobs/{job_id}", response_model=JobStatus)
    async def cancel(self, job_id: str) -> dict[str, Any]:
        return _unwrap(await self.manager.cancel.remote(job_id))

    @api.get("/v1/jobs/{job_id}/events")
    async def events(self, job_id: str, request: Request) -> StreamingResponse:
        """Server-Sent Events: `state`, `progress`, `checkpoint`, then one `end`.

        Resumes after the `Last-Event-ID` header (or `?after=`) when given."""
        after = int(request.headers.get("last-event-id", request.query_params.get("after", -1)))
        if await self.manager.get_job.remote(job_id) is None:
            raise _not_found(job_id)

        async def stream() -> AsyncIterator[str]:
            nonlocal after
            while True:
                batch = await self.manager.wait_events.remote(job_id, after, EVENT_POLL_S)
                if batch is None:
                    return
                if not batch:
                    yield ": keep-alive\n\n"
                    continue
                for event in batch:
                    after = event["seq"]
                    yield _sse(event)
                    if event["type"] == "end":
                        return

        return StreamingResponse(stream(), media_type="text/event-stream")

    @api.post("/v1/plans", response_model=PlanResponse)
    async def plans(self, request: PlanRequest) -> PlanResponse:
        """Rank every feasible layout of the job on the hardware asked about."""
        try:
            return rank_plans(request)
        except NothingFits as exc:
            raise HTTPException(status_code=422, detail=[{
                "loc": ["body", "spec", "parallel"], "msg": str(exc),
                "type": "nothing_fits", "suggestions": exc.suggestions,
            }]) from None

    @api.get("/v1/offers", response_model=OffersResponse)
    async def offers(self, job: str | None = None, policy: str | None = None,
                     keep: int = 20) -> dict[str, Any]:
        """The instance offers with current prices; with `?job=ID`, the policy's ranking of
        offer x market x node count for that job."""
        return _unwrap(await self.manager.offers.remote(None, policy, keep, job))

    @api.post("/v1/offers", response_model=OffersResponse)
    async def rank_offers(self, request: OffersRequest) -> dict[str, Any]:
        """The policy's ranking for a job spec, nothing submitted."""
        return _unwrap(await self.manager.offers.remote(
            request.spec.model_dump(mode="json"), request.policy, request.keep))

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @api.get("/metrics", response_class=PlainTextResponse)
    async def metrics(self) -> str:
        jobs = [JobStatus.model_validate(j) for j in await self.manager.list_jobs.remote()]
        return render_metrics(jobs)


def build_app(config: ServiceConfig) -> serve.Application:
    return RaytrainAPI.bind(config.model_dump(mode="json"))

