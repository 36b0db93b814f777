"""One wait on the job manager per followed job, however many event streams follow it.

Each open stream used to hold its own `wait_events` call on the job manager, an actor with a
bounded number of threads: fifty dashboards on one job took fifty of them, and a rank's
progress report could wait behind them. A `Feed` is one pump per job in the HTTP replica that
waits on the manager and keeps what it got, each event encoded for the wire once; every
stream of that job reads from it, and the feed stops with the last. (The replica's
StreamLimits, serve.http.limits, admits the streams.) A batch that changes more than
progress is told to `on_change` (the replica's status copy) before any stream sends it.
Written here because neither Starlette nor Ray Serve shares one upstream among many SSE
clients.

    feeds = Feeds(manager, poll_s=10.0, on_change=cache.heard_of_change)
    async with feeds.follow(job_id) as feed:
        batch = await feed.after(seq, timeout_s=10.0)  # [] on timeout, None: the job is gone
        for sent in batch: write(sent.text)            # `id: ..., event: ..., data: ...`
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, NamedTuple

from ray.exceptions import GetTimeoutError, RayActorError, TaskCancelledError

from raytrain.serve.jobs.event_log import EVENTS_KEPT_PER_JOB


class Sent(NamedTuple):
    """One event as every stream sends it."""

    seq: int
    type: str
    text: str  # the Server-Sent Event: id, event and data lines


def sse(event: dict[str, Any]) -> Sent:
    text = f"id: {event['seq']}\nevent: {event['type']}\ndata: {json.dumps(event)}\n\n"
    return Sent(event["seq"], event["type"], text)


class ManagerAway(Exception):
    """The job manager stopped answering while a feed waited on it."""


class Feed:
    def __init__(self, manager: Any, job_id: str, poll_s: float,
                 on_change: Callable[[], None] | None = None) -> None:
        self.manager, self.job_id, self.poll_s = manager, job_id, poll_s
        self.on_change = on_change
        self.events: list[Sent] = []
        self.gone = False  # the job was deleted
        self.away = False  # the manager stopped answering
        self.ended = False  # the job's `end` event came
        self.changed = asyncio.Condition()
        self.task: asyncio.Task[None] | None = None

    async def pump(self) -> None:
        last = -1
        while not self.ended:
            try:
                batch = await self.manager.wait_events.remote(self.job_id, last, self.poll_s)
            except (RayActorError, GetTimeoutError, TaskCancelledError):
                batch, self.away = [], True
            async with self.changed:
                if batch is None:
                    self.gone = True
                elif batch:
                    if self.on_change is not None and \
                            any(event["type"] != "progress" for event in batch):
                        self.on_change()
                    self.events.extend(sse(event) for event in batch)
                    del self.events[:-EVENTS_KEPT_PER_JOB]
                    last = batch[-1]["seq"]
                    self.ended = batch[-1]["type"] == "end"
                self.changed.notify_all()
            if self.gone or self.away:
                return

    async def after(self, seq: int, timeout_s: float) -> list[Sent] | None:
        """Events numbered above `seq`, waiting up to timeout_s for one ([] if none came);
        None once the job is gone. Raises ManagerAway if the manager stopped answering."""
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(
                    lambda: self.gone or self.away or self._fresh(seq)), timeout_s)
            except asyncio.TimeoutError:
                return []
            if self._fresh(seq):
                return [sent for sent in self.events if sent.seq > seq]
            if self.away:
                raise ManagerAway(self.job_id)
            return None

    def _fresh(self, seq: int) -> bool:
        return bool(self.events) and self.events[-1].seq > seq


class Feeds:
    """The replica's feeds, by job: made by the first stream of a job, stopped with its last.
    (Admission is StreamLimits', taken before a stream starts; `followers` counts those that
    read a feed.)"""

    def __init__(self, manager: Any, poll_s: float,
                 on_change: Callable[[], None] | None = None) -> None:
        self.manager, self.poll_s, self.on_change = manager, poll_s, on_change
        self.feeds: dict[str, Feed] = {}
        self.followers: Counter[str] = Counter()

    @asynccontextmanager
    async def follow(self, job_id: str) -> AsyncIterator[Feed]:
        """Follow a job's events, as one more of its streams."""
        feed = self.feeds.get(job_id)
        if feed is None or feed.away or feed.gone:
            feed = self.feeds[job_id] = Feed(self.manager, job_id, self.poll_s, self.on_change)
            feed.task = asyncio.create_task(feed.pump())
        self.followers[job_id] += 1
        try:
            yield feed
        finally:
            self.followers[job_id] -= 1
            if not self.followers[job_id]:  # the job's last stream left
                del self.followers[job_id]
                if self.feeds.get(job_id) is feed:
                    del self.feeds[job_id]
                if feed.task is not None:
                    feed.task.cancel()
