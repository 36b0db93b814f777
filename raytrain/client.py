"""The Python client: httpx over the HTTP API, spec models only (no torch, no ray).

    client = Client("http://127.0.0.1:8000")    # token: RAYTRAIN_TOKEN, or the local file
    job = client.submit(load_job_spec("examples/demo.yaml"))
    for event in job.events():
        print(event.type, event.data)
    status = job.wait()                       # blocks until SUCCEEDED, FAILED or CANCELLED

The token it sends is `token`, else RAYTRAIN_TOKEN, else (for a service on this machine) the
operator token in the service's state directory (raytrain.api_tokens.client_token). Every
submit carries an Idempotency-Key, so a retry after a timeout returns the job the first try
queued instead of queueing (and buying capacity for) a second one.

Errors come back as raytrain.errors types: SpecError (422, with field paths),
JobNotFoundError (404), JobStateError (409), NotAuthorizedError (401),
ServiceUnreachableError, ServiceError. The client prints nothing.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from raytrain.api_tokens import client_token
from raytrain.errors import (
    FieldError,
    JobNotFoundError,
    JobStateError,
    NotAuthorizedError,
    ServiceError,
    ServiceUnreachableError,
    SpecError,
)
from raytrain.spec import (
    ExportAnswer,
    JobEvent,
    JobHistory,
    JobLogs,
    JobSpec,
    JobStatus,
    OffersResponse,
    parse_job_spec,
)
from raytrain.spec.job import read_document

DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_FOR_S = 30.0  # how long a repeatable request keeps trying through a restart
RETRIED_STATUSES = (502, 503, 504)
MAX_PAUSE_S = 5.0
# how long a status read may trail the `end` event: a read answered by another replica than
# the stream's shows a change one long-poll answer (milliseconds) after the stream
END_READ_S = 10.0
EXPORT_TIMEOUT_S = 3600.0  # an export answers once its folder is written: a model's load


class Client:
    """The service's API from Python: submit, follow, list, cancel, resume, delete.

        with Client("http://127.0.0.1:8000") as client:
            job = client.submit("examples/demo.yaml")
            print(job.wait().state)  # SUCCEEDED

    The token sent is `token` if given, else $RAYTRAIN_TOKEN, else, for a service on this
    machine only, the operator token in its state directory ($RAYTRAIN_STATE_DIR, default
    ~/.raytrain). Errors are raytrain.errors types that say how to fix the call.
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        token = token or client_token(self.url)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._answered = False  # whether the service has answered this client yet
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport,
                                  headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------ calls

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/healthz")

    def submit(self, spec: JobSpec | dict[str, Any] | str | Path,
               idempotency_key: str | None = None) -> Job:
        """Queue a job from a JobSpec, a plain document, or a YAML/JSON file path. A timed-out
        or cut request is retried with the same Idempotency-Key (a new one each call unless
        given), so it never queues the job twice."""
        headers = {"Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        if isinstance(spec, (str, Path)):
            spec = read_document(Path(spec), "job spec")
        if isinstance(spec, dict):
            document = spec
            try:
                spec = parse_job_spec(document)
            except SpecError as here:
                # The service knows what the file cannot tell (the cluster's room): its
                # answer names every problem, a job that could never start there first.
                # Without a service to ask, the file's own.
                try:
                    answer = self._request("POST", "/v1/jobs", json=document, headers=headers)
                except ServiceUnreachableError:
                    raise here from None
                return Job(self, JobStatus.model_validate(answer).id)
        body = spec.model_dump(mode="json") if isinstance(spec, JobSpec) else spec
        answer = self._request("POST", "/v1/jobs", json=body, headers=headers)
        return Job(self, JobStatus.model_validate(answer).id)

    def job(self, job_id: str) -> Job:
        return Job(self, job_id)

    def get(self, job_id: str) -> JobStatus:
        return JobStatus.model_validate(self._request("GET", f"/v1/jobs/{job_id}", job_id))

    def list(self, states: list[str] | None = None) -> list[JobStatus]:
        """Every job (in `states`, if given), oldest first, following the service's pages."""
        jobs: list[JobStatus] = []
        params: dict[str, Any] = {"state": states or []}
        while True:
            response = self._send("GET", "/v1/jobs", None, params=params)
            jobs += [JobStatus.model_validate(j) for j in response.json()]
            cursor = response.headers.get("x-next-cursor")
            if not cursor:
                return jobs
            params = {**params, "after": cursor}

    def cancel(self, job_id: str) -> JobStatus:
        return JobStatus.model_validate(self._request("DELETE", f"/v1/jobs/{job_id}", job_id))

    def resume(self, job_id: str, budget_usd: float | None = None) -> Job:
        """Queue a new job that goes on from a failed or cancelled job's latest checkpoint,
        with its own budget if given (JobStateError if it has none, or has not ended)."""
        answer = self._request("POST", f"/v1/jobs/{job_id}/resume", job_id,
                               json={"budget_usd": budget_usd},
                               headers={"Idempotency-Key": uuid.uuid4().hex})
        return Job(self, JobStatus.model_validate(answer).id)

    def export(self, job_id: str, step: int | None = None, merge: bool = False,
               dtype: str | None = None) -> ExportAnswer:
        """Write a kind 'hf' job's checkpoint (the latest, or `step`'s) as a Hugging Face
        folder in the job's storage (a LoRA job's adapter, or with `merge` its merged
        model); where it is (`path`). Waits while it is written."""
        return ExportAnswer.model_validate(self._request(
            "POST", f"/v1/jobs/{job_id}/export", job_id,
            json={"step": step, "merge": merge, "dtype": dtype},
            timeout=EXPORT_TIMEOUT_S))

    def delete(self, job_id: str) -> JobStatus:
        """Forget an ended job with its checkpoints and logs (JobStateError while it runs)."""
        return JobStatus.model_validate(self._request(
            "DELETE", f"/v1/jobs/{job_id}", job_id, params={"purge": "true"}))

    def logs(self, job_id: str, offsets: dict[int, int] | None = None,
             rank: int | None = None) -> JobLogs:
        """Each worker's output by rank: the tail, or what follows `offsets` (from the
        previous answer's `offset` per rank)."""
        params: dict[str, Any] = {"offset": [f"{r}:{o}" for r, o in (offsets or {}).items()]}
        if rank is not None:
            params["rank"] = rank
        return JobLogs.model_validate(self._request(
            "GET", f"/v1/jobs/{job_id}/logs", job_id, params=params))

    def history(self, job_id: str, all_steps: bool = True) -> JobHistory:
        """The job's progress points (time, step, loss, tokens/s, dollars), oldest first, and
        its steps' rows (loss, lr, grad_norm, tokens): every one, the pages followed
        (`all_steps=False`: the first page only)."""
        first = JobHistory.model_validate(self._request(
            "GET", f"/v1/jobs/{job_id}/history", job_id))
        steps, after = list(first.steps), first.next_after_step
        while all_steps and after is not None:
            page = JobHistory.model_validate(self._request(
                "GET", f"/v1/jobs/{job_id}/history", job_id, params={"after_step": after}))
            steps += page.steps
            after = page.next_after_step
        return first.model_copy(update={"steps": steps, "next_after_step": after})

    def offers(self, spec: JobSpec | None = None, job_id: str | None = None,
               policy: str | None = None) -> OffersResponse:
        """The service's offers; with a spec or a job id, the policy's ranking for it."""
        if spec is not None:
            body = {"spec": spec.model_dump(mode="json"), "policy": policy}
            return OffersResponse.model_validate(self._request("POST", "/v1/offers", json=body))
        params = {k: v for k, v in (("job", job_id), ("policy", policy)) if v is not None}
        return OffersResponse.model_validate(
            self._request("GET", "/v1/offers", job_id, params=params))

    def events(self, job_id: str, after: int = -1) -> Iterator[JobEvent]:
        """Follow a job's Server-Sent Events until its `end` event, reconnecting if cut."""
        while True:
            try:
                with self._http.stream(
                    "GET",
                    f"/v1/jobs/{job_id}/events",
                    headers={"Last-Event-ID": str(after)},
                    timeout=httpx.Timeout(self._http.timeout.connect, read=60.0),
                ) as response:
                    if response.status_code != 200:
                        response.read()
                        self._raise_for(response, job_id)
                    for event in _parse_sse(response.iter_lines()):
                        after = event.seq
                        yield event
                        if event.type == "end":
                            return
            except (httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.ReadError):
                time.sleep(0.5)  # the stream was cut: pick up after the last event seen
            except httpx.ConnectError as exc:
                raise ServiceUnreachableError(self.url, str(exc)) from None

    # ---------------------------------------------------------------------------- plumbing

    def _request(self, method: str, path: str, job_id: str | None = None, **kwargs: Any) -> Any:
        return self._send(method, path, job_id, **kwargs).json()

    def _send(self, method: str, path: str, job_id: str | None = None,
              **kwargs: Any) -> httpx.Response:
        """Send a request. One that is safe to repeat (a read, a keyed submit, a plan or offer
        ranking) is retried with backoff for RETRY_FOR_S while the service answers 502-504 or
        cuts the connection, and, once it has answered this client, while it refuses
        connections (restarting); a cancel is not."""
        retry = method == "GET" or "Idempotency-Key" in kwargs.get("headers", {}) or \
            path in ("/v1/plans", "/v1/offers")
        give_up = time.monotonic() + (RETRY_FOR_S if retry else 0.0)
        pause = 0.25
        while True:
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                # Refused before this client was ever answered: a wrong address or a service
                # not started, which waiting does not fix. Say so at once.
                first_contact = isinstance(exc, httpx.ConnectError) and not self._answered
                if first_contact or time.monotonic() + pause > give_up:
                    raise ServiceUnreachableError(
                        self.url, str(exc) or type(exc).__name__) from None
            else:
                self._answered = True
                if response.status_code not in RETRIED_STATUSES or \
                        time.monotonic() + pause > give_up:
                    break
                pause = max(pause, min(_retry_after(response), MAX_PAUSE_S))
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE_S)
        if response.status_code >= 400:
            self._raise_for(response, job_id)
        return response

    @staticmethod
    def _raise_for(response: httpx.Response, job_id: str | None) -> None:
        try:
            detail = response.json().get("detail")
        except (json.JSONDecodeError, AttributeError):
            detail = response.text
        if response.status_code == 422 and isinstance(detail, list):
            raise SpecError(
                [
                    FieldError(tuple(e["loc"][1:] if e["loc"][:1] == ["body"] else e["loc"]),
                               e["msg"])
                    for e in detail
                ]
            )
        if response.status_code == 404:
            raise JobNotFoundError(job_id or str(detail))
        if response.status_code == 409:
            raise JobStateError(str(detail))
        if response.status_code == 401:
            raise NotAuthorizedError(str(detail))
        raise ServiceError(response.status_code, detail)


def _retry_after(response: httpx.Response) -> float:
    try:
        return float(response.headers.get("retry-after", 0))
    except ValueError:
        return 0.0


class Job:
    """A handle on one submitted job."""

    def __init__(self, client: Client, job_id: str) -> None:
        self.client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> JobStatus:
        return self.client.get(self.id)

    def events(self, after: int = -1) -> Iterator[JobEvent]:
        return self.client.events(self.id, after)

    def cancel(self) -> JobStatus:
        return self.client.cancel(self.id)

    def wait(self, on_event: Callable[[JobEvent], None] | None = None) -> JobStatus:
        """Block until the job ends and return its final status; `on_event` sees each event
        on the way (the CLI draws its progress bar from them)."""
        for event in self.events():
            if on_event is not None:
                on_event(event)
        status, read_until = self.status(), time.monotonic() + END_READ_S
        while not status.state.is_terminal and time.monotonic() < read_until:
            time.sleep(0.1)
            status = self.status()
        return status


def _parse_sse(lines: Iterator[str]) -> Iterator[JobEvent]:
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield JobEvent.model_validate_json("\n".join(data))
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
