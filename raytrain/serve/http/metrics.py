"""/metrics in Prometheus' text format, written by the official prometheus_client.

The job manager owns the figures (core.tally: counters kept in its store, histograms, each job's
series within the retention window) and hands a snapshot to the HTTP replica at each scrape;
`exposition` turns it into metric families. Request latency is measured here, in the replica,
by route template (never the raw path, so job ids do not multiply series), method and status.
With several replicas each keeps its own latency histogram, labelled with `replica`, so a
scrape landing on either replica never shows one replica's counter falling to another's.

    app.add_middleware(RequestLatency, histogram=latency)
    body, content_type = exposition(snapshot, latency, request.headers.get("accept"))
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Iterator

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE_OPENMETRICS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from raytrain.core.tally import COUNTERS, ENDED_HELP, HISTOGRAMS, JOB_GAUGES

__all__ = ["CONTENT_TYPE_OPENMETRICS", "CONTENT_TYPE_PLAIN_0_0_4", "RequestLatency",
           "auth_refusals", "exposition", "request_latency"]

PREFIX = "raytrain_"
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
REPLICA = f"{socket.gethostname()}:{os.getpid()}"


def request_latency() -> Histogram:
    """A latency histogram for one app (not in the global registry: each app its own)."""
    return Histogram(f"{PREFIX}http_request_duration_seconds",
                     "Seconds from a request's arrival to its response's headers, by route.",
                     ["route", "method", "code", "replica"], registry=None,
                     buckets=LATENCY_BUCKETS_S)


def auth_refusals() -> Counter:
    """Requests refused by the token check, by reason (one app's; serve.http.auth)."""
    return Counter(f"{PREFIX}http_auth_refusals", "Requests refused for want of a valid token: "
                   "missing_token (401), invalid_token (401), slowed (429: the address "
                   "guessed too often).",
                   ["reason"], registry=None)


class RequestLatency:
    """ASGI middleware: observes each HTTP request's time to the start of its response (for an
    event stream, the time to its headers, not the stream's life)."""

    def __init__(self, app: ASGIApp, histogram: Histogram) -> None:
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                self.histogram.labels(getattr(route, "path", "unmatched"), scope["method"],
                                      str(message["status"]), REPLICA).observe(
                    time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed_send)


class _Snapshot:
    """A collector over one snapshot of the job manager's figures."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        for name, help_text in COUNTERS.items():
            yield CounterMetricFamily(PREFIX + name, help_text, value=s["counters"][name])
        ended = CounterMetricFamily(f"{PREFIX}jobs_ended", ENDED_HELP, labels=["state"])
        for state, count in s["ended"].items():
            ended.add_metric([state], count)
        yield ended
        for name, (help_text, bounds) in HISTOGRAMS.items():
            saved = s["histograms"][name]
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, bounds), "+Inf"], saved["counts"]):
                cumulative += count
                buckets.append((bound, cumulative))
            yield HistogramMetricFamily(PREFIX + name, help_text, buckets=buckets,
                                        sum_value=saved["total"])
        jobs = GaugeMetricFamily(f"{PREFIX}jobs", "Jobs the service knows, by state.",
                                 labels=["state"])
        for state, count in s["jobs_by_state"].items():
            jobs.add_metric([state], count)
        yield jobs
        yield GaugeMetricFamily(f"{PREFIX}usd_per_hour",
                                "Hourly price of the capacity active jobs hold.",
                                value=s["usd_per_hour"])
        labels = ["job", "name", "state"]
        for name, (help_text, _) in JOB_GAUGES.items():
            family = GaugeMetricFamily(PREFIX + name, help_text, labels=labels)
            for series in s["job_series"]:
                if name in series["values"]:
                    family.add_metric([series["labels"][k] for k in labels],
                                      series["values"][name])
            yield family


def exposition(snapshot: dict[str, Any], latency: Histogram, accept: str | None,
               *replica: Counter) -> tuple[bytes, str]:
    """The scrape's body and content type, in the format the scraper's Accept header asks for
    (Prometheus' text format 0.0.4 by default, OpenMetrics if asked)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(snapshot))
    registry.register(latency)
    for collector in replica:  # this replica's own counters
        registry.register(collector)
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type
