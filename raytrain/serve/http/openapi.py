"""What the OpenAPI document says beyond what FastAPI infers from the routes: the error bodies
(400, 401, 404, 409, 413, 422, 429, 503) with their meaning per route, the event stream's
format, the bearer token, and a 405 whose `Allow` header lists every method of the path
(Starlette's names only the first route that matched it), and 422 for a query parameter the
route does not take.

    @api.get(..., responses=errors(404, 409))  # per route
    document(api, open_paths)           # security scheme and the SSE format
    api = FastAPI(dependencies=[Depends(no_unknown_query)])
    api.add_exception_handler(StarletteHTTPException, allow_every_method)

The fuzzer (tests/service/test_api_fuzz.py, benchmarks/api_fuzz.py) checks that every answer is
one the document lists, in the documented content type and schema.
"""

from __future__ import annotations

from typing import Any, Union

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from raytrain.spec import JobEvent


class Problem(BaseModel):
    """An error: what went wrong and how to fix it, in one sentence."""

    detail: str = Field(description="What was refused and why, then 'To fix: ...'.")


class FieldProblem(BaseModel):
    """One bad field of a request."""

    model_config = ConfigDict(extra="allow")
    loc: list[Union[str, int]] = Field(
        description="Where: 'body', 'query', 'path' or 'header', then the field's path.")
    msg: str = Field(description="What is wrong with it and how to fix it.")
    type: str = Field(description="A machine-readable kind, e.g. missing, value_error, "
                      "invalid_combination, nothing_fits.")
    input: Any = Field(None, description="An excerpt of the value sent.")
    suggestions: list[str] | None = Field(
        None, description="For nothing_fits: the smallest changes that would fit.")


class FieldProblems(BaseModel):
    """The request's bad fields, all of them: nothing was done."""

    detail: list[FieldProblem] = Field(description="One entry per bad field.")


MEANING = {
    400: "The body could not be read as JSON. Nothing was done.",
    401: "No valid bearer token. Nothing was done; the body was not read.",
    404: "No job with that id.",
    409: "The job's state does not allow this (it already ended, or still runs), or an "
         "Idempotency-Key was reused with a different spec.",
    413: "The body is over 1 MiB; it was not read.",
    422: "A field is invalid: each bad field's path and how to fix it. This includes rules "
         "spanning several fields that the schema cannot say (a model.kind's own section, "
         "parallel degrees that multiply to the worker count, a layout that does not fit, "
         "an unknown policy or package), so a body the schema accepts can still answer 422.",
    429: "Over a limit (jobs queued or running, open event streams, or too many requests "
         "with a wrong token from this address); retry after Retry-After seconds.",
    503: "The job manager is not answering (starting or restarting); nothing was done. "
         "Retry after Retry-After seconds.",
}
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.",
                               "schema": {"type": "integer"}}}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route that can answer these statuses besides 401, 429 (an address
    guessing tokens is slowed: serve.http.auth) and 503."""
    answers: dict[int | str, dict[str, Any]] = {}
    for status in sorted({*statuses, 401, 429, 503}):
        answer: dict[str, Any] = {"model": FieldProblems if status == 422 else Problem,
                                  "description": MEANING[status]}
        if status in (429, 503):
            answer["headers"] = RETRY_AFTER
        answers[status] = answer
    return answers


SSE_FORMAT = (
    "Server-Sent Events, one per state change, progress report, checkpoint and preemption, "
    "then one `end`:\n\n    id: <seq>\n    event: <type>\n    data: <JobEvent as JSON>\n\n"
    "Lines starting with ':' are keep-alive comments. Event numbers only grow, also across "
    "service restarts: reconnect with `Last-Event-ID: <seq>` to miss nothing. Each `data` "
    "line is a JobEvent (components/schemas/JobEvent).")


def event_stream() -> dict[int | str, dict[str, Any]]:
    """`responses=` for the event stream: 200 as text/event-stream (its schema is one event's,
    as OpenAPI 3.2's itemSchema means and the fuzzer reads it), and its errors."""
    event = {"type": "object", "required": ["data"], "properties": {
        "id": {"type": "string", "description": "The event's seq."},
        "event": {"type": "string", "enum": ["state", "progress", "checkpoint", "preemption",
                                             "group", "end"]},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"$ref": "#/components/schemas/JobEvent"},
                 "description": "The JobEvent, as JSON."}}}
    return {200: {"description": SSE_FORMAT, "content": {"text/event-stream": {
        "schema": event}}}, **errors(404, 422, 429)}


def document(api: FastAPI, open_paths: frozenset[str]) -> None:
    """Add the bearer token and the JobEvent schema to the app's OpenAPI document."""

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            doc = get_openapi(title=api.title, version=api.version,
                              description=api.description, routes=api.routes)
            components = doc.setdefault("components", {})
            components.setdefault("securitySchemes", {})["bearer"] = {
                "type": "http", "scheme": "bearer",
                "description": "A token from the service's tokens.json (`raytrain token`)."}
            components.setdefault("schemas", {})["JobEvent"] = JobEvent.model_json_schema(
                ref_template="#/components/schemas/{model}")
            doc["security"] = [{"bearer": []}]
            for path, operations in doc["paths"].items():
                if path in open_paths:
                    for operation in operations.values():
                        operation["security"] = []
            api.openapi_schema = doc
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


def no_unknown_query(request: Request) -> None:
    """Refuse a query parameter the route does not take (422), so a typo such as
    `?stat=RUNNING` is not silently ignored (an app-wide dependency)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = {param.alias for param in dependant.query_params}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise RequestValidationError([{
            "loc": ["query", name], "type": "extra_forbidden", "input": None,
            "msg": f"{name[:40]!r} is not a query parameter of {getattr(route, 'path', '')}. "
                   f"To fix: send "
                   f"only {', '.join(sorted(known)) or 'none'}"} for name in unknown])


async def allow_every_method(request: Request, exc: Exception) -> Response:
    """405 lists in `Allow` every method the path takes, not only the first route's."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        methods = set()
        for route in request.app.router.routes:
            match, _ = route.matches({**request.scope, "method": "GET"})
            if match == Match.FULL or match == Match.PARTIAL:
                methods |= set(getattr(route, "methods", None) or ())
        exc = StarletteHTTPException(405, exc.detail, headers={
            "Allow": ", ".join(sorted(methods))})
    return await http_exception_handler(request, exc)
