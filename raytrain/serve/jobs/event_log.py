"""Each job's event stream, as the SSE endpoint reads it: numbered events kept in memory (the
last EVENTS_KEPT_PER_JOB of them), whose numbers only grow, also across a restart of the job
manager (the store keeps each job's next number, and a reloaded log starts past it).

The job manager appends what the lifecycle emits and waits on its own condition for new
events; nothing here takes a lock of its own (callers hold the manager's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from raytrain.spec import JobEvent, JobStatus

EVENTS_KEPT_PER_JOB = 5000
# Records are saved on every state change and checkpoint and at least every few seconds of
# progress (one report a second at most): far fewer events than this can follow a record's
# last save.
RELOAD_EVENT_SEQ_GAP = 10_000


@dataclass
class EventLog:
    first_seq: int = 0
    events: list[JobEvent] = field(default_factory=list)

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.events)

    @classmethod
    def reloaded(cls, saved_next_seq: int) -> EventLog:
        """A log for a record read back from the store: events emitted after its last save
        were not counted in it, so start past any number they could have taken."""
        return cls(first_seq=saved_next_seq + RELOAD_EVENT_SEQ_GAP if saved_next_seq else 0)

    def append(self, job_id: str, kind: str, data: Mapping[str, Any], now: float) -> None:
        self.events.append(JobEvent(seq=self.next_seq, type=kind,
                                    job_id=job_id, time=now, data=dict(data)))
        if len(self.events) > EVENTS_KEPT_PER_JOB:
            drop = len(self.events) - EVENTS_KEPT_PER_JOB
            del self.events[:drop]
            self.first_seq += drop

    def after(self, seq: int) -> list[dict[str, Any]]:
        """Events numbered above `seq`, as JSON."""
        fresh = self.events[max(0, seq + 1 - self.first_seq):]
        return [event.model_dump(mode="json") for event in fresh]

    def replay(self, job: JobStatus, now: float) -> list[dict[str, Any]]:
        """For a record reloaded after a restart (no history): its state, and its end if it
        ended."""
        self.append(job.id, "state", {"state": job.state.value, "message": job.message}, now)
        if job.state.is_terminal:
            self.append(job.id, "end", {"state": job.state.value, "error": job.error}, now)
        return self.after(-1)
