"""What the job manager keeps so that copies of its statuses (the HTTP replicas' caches,
raytrain.serve.http.reads) stay current cheaply: a version for every status change, and each
job's place in the list.

    versions = Versions(); versions.touch("j1")
    versions.changes(None, 0, jobs, encoded)   # all of `jobs`: a copy's first call
"""

from __future__ import annotations

import uuid
from itertools import takewhile
from typing import Any, Callable, Mapping


def list_cursor(created_at: float, job_id: str) -> str:
    """A job's place in the list, oldest first: its creation time, then its id."""
    return f"{created_at:017.6f}:{job_id}"


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
