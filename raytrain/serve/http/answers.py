"""How the HTTP API answers what went wrong: a refused body (422, each field with its fix and
only an excerpt of what was sent), the job manager away (503 with Retry-After, nothing
changed), and the job manager's refusals (the exceptions of raytrain.errors it raises, which
Ray hands back wrapped) as the HTTP errors that say them.

    api.add_exception_handler(RequestValidationError, refused_submit(manager))
    add_refusals(api)
    return await manager.submit.remote(spec, caller, key)  # a JobStatus, or a refusal
"""

import json
import logging
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray.exceptions import RayTaskError

from raytrain.errors import (
    JobNotFoundError,
    JobStateError,
    RetryLaterError,
    ServiceBusyError,
    SpecError,
)
from raytrain.spec.fixes import with_fix

EXCERPT_CHARS = 200
MANAGER_RETRY_AFTER_S = 5

logger = logging.getLogger(__name__)


def excerpt(value: Any) -> Any:
    """`value` if its JSON is short, else the first EXCERPT_CHARS characters of it."""
    text = json.dumps(jsonable_encoder(value), default=str)
    return value if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def refused_submit(manager: Any) -> Any:
    """The handler of a refused request: 422 with each bad field's path, message with its
    fix, and only an excerpt of its input. For POST /v1/jobs it first asks `manager` whether
    the job's resources alone could ever start here: if not, that comes first (the other
    errors' fixes would not make it run)."""

    async def handler(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = field_errors(request, exc)
        if request.method == "POST" and request.url.path == "/v1/jobs":
            try:
                document = json.loads(await request.body())
            except ValueError:
                document = None
            first = None
            if isinstance(document, dict):
                try:
                    first = await manager.capacity_refusal.remote(document.get("resources"))
                except Exception as exc:  # noqa: BLE001 - the field errors alone, not a 500
                    logger.warning("capacity check of a refused job failed: %r", exc)
            if first is not None:
                errors = [{**first, "loc": ["body", *first["loc"]]}, *errors]
        return JSONResponse(status_code=422, content={"detail": errors})

    return handler


def field_errors(request: Request, exc: RequestValidationError) -> list[Any]:
    """Each bad field's path, message with its fix, and an excerpt of its input."""
    errors = []
    route = request.scope.get("route")
    bodies = getattr(getattr(route, "dependant", None), "body_params", None) or []
    body = bodies[0].field_info.annotation if len(bodies) == 1 else None  # the whole body
    for error in exc.errors():
        in_body = tuple(error.get("loc", ()))[:1] == ("body",)
        error = {**error, "msg": with_fix(error, body if in_body else None, skip=1)}
        error = {k: v for k, v in error.items() if k not in ("ctx", "url")}
        if "input" in error:
            error["input"] = excerpt(error["input"])
        errors.append(error)
    encoded: list[Any] = jsonable_encoder(errors)
    return encoded


async def manager_away(request: Request, exc: Exception) -> JSONResponse:
    logger.warning("the job manager did not answer %s %s: %s", request.method,
                   request.url.path, type(exc).__name__)
    return JSONResponse(
        status_code=503, headers={"Retry-After": str(MANAGER_RETRY_AFTER_S)},
        content={"detail": "the job manager is not answering (restarting, or starting up); "
                 f"no job was changed. To fix: retry in {MANAGER_RETRY_AFTER_S} s"})


def add_refusals(api: Any) -> None:
    """Answer each refusal the job manager raises with its HTTP error: 422 for a spec (each
    field under `body`), 404 for an unknown job, 409 for a job whose state forbids it, 429
    (service full) and 503 (store failing) with Retry-After; nothing was changed."""
    for kind in (SpecError, JobNotFoundError, JobStateError, RetryLaterError):
        api.add_exception_handler(kind, refusal)


async def refusal(request: Request, exc: Exception) -> JSONResponse:
    cause = exc.cause if isinstance(exc, RayTaskError) else exc  # what the actor raised
    if isinstance(cause, SpecError):
        return JSONResponse(status_code=422, content={"detail": [
            {**e.to_json(), "loc": ["body", *e.loc]} for e in cause.errors]})
    if isinstance(cause, JobNotFoundError):
        return JSONResponse(status_code=404,
                            content={"detail": f"no job with id {cause.job_id!r}"})
    if isinstance(cause, RetryLaterError):
        return JSONResponse(status_code=429 if isinstance(cause, ServiceBusyError) else 503,
                            content={"detail": cause.detail},
                            headers={"Retry-After": str(cause.retry_after_s)})
    return JSONResponse(status_code=409, content={"detail": str(cause)})
