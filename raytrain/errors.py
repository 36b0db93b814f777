"""The one exception tree of raytrain. Every message says what failed, why, and how to fix it.

    RaytrainError
    ├── SpecError              a job spec (or service config) is invalid; carries field paths
    ├── JobNotFoundError       no job with that id
    ├── JobStateError          the job cannot do that in its current state
    ├── RetryLaterError        the service cannot take the request now; nothing changed
    │   ├── ServiceBusyError       it holds as many jobs as it may (HTTP 429)
    │   └── ServiceUnavailableError  its job store or storage fails (HTTP 503)
    ├── IllegalTransition      a job's state was asked to make a move its lifecycle forbids
    ├── ServiceUnreachableError  the raytrain service cannot be reached
    ├── ServiceError           the service answered with an unexpected error
    ├── StoreError             the object store or folder that keeps checkpoints failed
    └── TrainingError          training itself failed (a worker raised, retries exhausted)

Expected outcomes (no capacity, a preemption) are states and decisions, not exceptions.

Every type pickles to itself with the same message and fields (`__reduce__` rebuilds it from
its constructor's arguments), since errors raised in a training worker cross Ray's process
boundaries on their way to the job's status.
"""

from __future__ import annotations

from dataclasses import dataclass


class RaytrainError(Exception):
    """Base of every error raytrain raises on purpose."""

    def __reduce__(self) -> tuple[object, ...]:
        # Exception pickles as cls(*self.args), and args is the formatted message: a subclass
        # whose constructor takes other arguments would be rebuilt from the wrong ones.
        return (type(self), self._init_args())

    def _init_args(self) -> tuple[object, ...]:
        return self.args


@dataclass(frozen=True)
class FieldError:
    """One invalid field: `loc` is the path into the document, e.g. ("training", "steps")."""

    loc: tuple[str | int, ...]
    msg: str

    @property
    def path(self) -> str:
        return ".".join(str(part) for part in self.loc) or "<root>"

    def to_json(self) -> dict[str, object]:
        return {"loc": list(self.loc), "msg": self.msg, "type": "value_error"}


class SpecError(RaytrainError):
    """A job spec or config failed validation. `errors` names each bad field."""

    def __init__(self, errors: list[FieldError], source: str = "job spec") -> None:
        self.errors = list(errors)
        self.source = source
        lines = [f"  {e.path}: {e.msg}" for e in self.errors]
        super().__init__(f"invalid {source} ({len(self.errors)} error(s)):\n" + "\n".join(lines))

    def _init_args(self) -> tuple[object, ...]:
        return (self.errors, self.source)


class JobNotFoundError(RaytrainError):
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}. To fix: list jobs with `raytrain list`.")

    def _init_args(self) -> tuple[object, ...]:
        return (self.job_id,)


class JobStateError(RaytrainError):
    """The job's state does not allow the operation."""


class RetryLaterError(RaytrainError):
    """The service cannot take the request now and changed nothing; `retry_after_s` says
    when to try again."""

    def __init__(self, detail: str, retry_after_s: int) -> None:
        self.detail, self.retry_after_s = detail, retry_after_s
        super().__init__(detail)

    def _init_args(self) -> tuple[object, ...]:
        return (self.detail, self.retry_after_s)


class ServiceBusyError(RetryLaterError):
    """The service holds as many queued and running jobs as it may (HTTP 429)."""


class ServiceUnavailableError(RetryLaterError):
    """The service's job store does not take writes, or its storage fails (HTTP 503)."""


class NotAuthorizedError(RaytrainError):
    """The service refused the request's token (HTTP 401)."""


class ServiceUnreachableError(RaytrainError):
    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(
            f"cannot reach the raytrain service at {url}: {reason}. To fix: start it with "
            "`raytrain serve`, or point --server / RAYTRAIN_SERVER at a running one."
        )

    def _init_args(self) -> tuple[object, ...]:
        return (self.url, self.reason)


class ServiceError(RaytrainError):
    def __init__(self, status_code: int, detail: object) -> None:
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"the raytrain service answered {status_code}: {detail}")

    def _init_args(self) -> tuple[object, ...]:
        return (self.status_code, self.detail)


class StoreError(RaytrainError):
    """Reading or writing the storage that keeps checkpoints, logs and job records failed.
    `uri` names the store (never a credential); `fix` says what to change."""

    def __init__(self, uri: str, what: str, cause: object, fix: str = "") -> None:
        self.uri, self.what, self.cause, self.fix = uri, what, str(cause), fix
        hint = f" To fix: {fix}." if fix else ""
        super().__init__(f"storage {uri}: {what} failed: {self.cause}.{hint}")

    def _init_args(self) -> tuple[object, ...]:
        return (self.uri, self.what, self.cause, self.fix)


class TrainingError(RaytrainError):
    """Training failed for a reason other than bad input."""


class IllegalTransition(RaytrainError):
    """A move raytrain.core.lifecycle does not allow: a bug in the caller, never the user's
    input."""

    def __init__(self, job_id: str, old: str, new: str) -> None:
        self.job_id, self.old, self.new = job_id, old, new
        super().__init__(f"job {job_id} cannot move from {old} to {new}. To fix: this is a "
                         "bug in raytrain's job manager; please report it with the job's events")

    def _init_args(self) -> tuple[object, ...]:
        return (self.job_id, self.old, self.new)
