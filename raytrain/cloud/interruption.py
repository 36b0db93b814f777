"""Spot interruption notices: the instance metadata service read from every worker.

AWS warns two minutes before it takes a spot instance back, through the instance metadata
service (IMDSv2: a session token from `PUT /latest/api/token`, then
`GET /latest/meta-data/spot/instance-action`, 404 until a notice exists) and, earlier and
less surely, with a rebalance recommendation (`.../events/recommendations/rebalance`). A
`Watcher` thread polls a `NoticeSource` and raises two flags the training loop reads: take a
checkpoint now (rebalance), or checkpoint and stop (interruption). Other clouds' notices fit
behind the same one-method interface (`poll`).

Which workers watch, and where, is `watch_endpoint`: only workers on nodes the service bought
on the spot market of a cloud that has a metadata service (AWS), or every worker when the
operator names an endpoint (`ServiceConfig.interruption_endpoint`, which is also how a test
serves the same protocol on 127.0.0.1). A local run contacts no metadata address. A node that
has no metadata service after all is noticed on the first failed poll; the watcher then stops
quietly.

    watcher = Watcher(Ec2Metadata("http://169.254.169.254"), interval_s=1.0).start()
    watcher.take_checkpoint_request(), watcher.stop_requested
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

import httpx

logger = logging.getLogger(__name__)

TOKEN_TTL_S = 21600
# Clouds whose spot instances hear of an interruption through an instance metadata service.
METADATA_ENDPOINTS = {"aws": "http://169.254.169.254"}


def watch_endpoint(configured: str | None, market: str, provider: str | None) -> str | None:
    """The metadata endpoint a job's workers watch for notices, or None: do not watch.

        watch_endpoint(None, "spot", "aws")        # -> "http://169.254.169.254"
        watch_endpoint(None, "local", None)        # -> None (a laptop, a fixed cluster)
        watch_endpoint("http://127.0.0.1:8111", "local", None)  # the operator's choice wins
    """
    if configured:
        return configured
    if market == "spot" and provider is not None:
        return METADATA_ENDPOINTS.get(provider)
    return None


@dataclass(frozen=True)
class Notice:
    kind: str  # "interruption" (the instance will be taken) | "rebalance" (it may be)
    detail: str  # what the metadata service said
    received_at: float  # unix time


class NoticeSource(Protocol):
    def poll(self) -> Notice | None:
        """The current notice, if any; raises OSError-like httpx errors when unreachable."""


class Ec2Metadata:
    """EC2's instance metadata service, IMDSv2."""

    def __init__(self, endpoint: str, timeout_s: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._http = httpx.Client(timeout=timeout_s)
        self._token: str | None = None

    def _get(self, path: str) -> httpx.Response:
        if self._token is None:
            answer = self._http.put(f"{self.endpoint}/latest/api/token",
                                    headers={"X-aws-ec2-metadata-token-ttl-seconds":
                                             str(TOKEN_TTL_S)})
            answer.raise_for_status()
            self._token = answer.text
        response = self._http.get(f"{self.endpoint}{path}",
                                  headers={"X-aws-ec2-metadata-token": self._token})
        if response.status_code == 401:  # the token expired: take a new one once
            self._token = None
            return self._get(path)
        return response

    def poll(self) -> Notice | None:
        action = self._get("/latest/meta-data/spot/instance-action")
        if action.status_code == 200:
            return Notice("interruption", action.text, time.time())
        rebalance = self._get("/latest/meta-data/events/recommendations/rebalance")
        if rebalance.status_code == 200:
            return Notice("rebalance", rebalance.text, time.time())
        return None


class Watcher:
    """Polls a notice source in a daemon thread and keeps the first notice of each kind."""

    def __init__(self, source: NoticeSource, interval_s: float = 1.0) -> None:
        self.source = source
        self.interval_s = interval_s
        self.interruption: Notice | None = None
        self.rebalance: Notice | None = None
        self._checkpoint_taken = False
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="interruption-watcher",
                                        daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()

    def take_checkpoint_request(self) -> bool:
        """True once after a rebalance recommendation: checkpoint now, keep training."""
        if self.rebalance is not None and not self._checkpoint_taken:
            self._checkpoint_taken = True
            return True
        return False

    @property
    def stop_requested(self) -> bool:
        return self.interruption is not None

    @property
    def noticed_at(self) -> float | None:
        return None if self.interruption is None else self.interruption.received_at

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                notice = self.source.poll()
            except httpx.HTTPError as exc:
                logger.info("no instance metadata service (%s): not watching for spot "
                            "interruptions on this node", exc)
                return
            if notice is not None and notice.kind == "interruption" and self.interruption is None:
                logger.warning("spot interruption notice: %s", notice.detail)
                self.interruption = notice
                return  # nothing more to learn: the instance is going
            if notice is not None and notice.kind == "rebalance" and self.rebalance is None:
                logger.warning("spot rebalance recommendation: %s", notice.detail)
                self.rebalance = notice
            self._stopping.wait(self.interval_s)
