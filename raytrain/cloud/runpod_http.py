"""One request to RunPod, as its APIs answer today: the key in an `Authorization: Bearer`
header (never in a URL, so no log line carries it), RFC 9457 problem documents read into
errors that say what to do, the rate limits respected, and a retired API said to be retired.

RunPod's REST API v2 (https://api.runpod.io/v2, OpenAPI at /v2/openapi.json) sends on every
answer to an authenticated request the IETF draft's `RateLimit` header, one member per window
(`"minute";r=0;t=12, "hour";r=2800;t=1812, ...`: requests left, seconds to the window's
reset), and on a 429 a `Retry-After`. The client waits before a request while a window it
has used up is still running, and on a 429 waits `Retry-After` and asks again, up to
RETRIES_ON_429 times (then RunPodUnavailable). Written by hand: httpx has no rate-limit
support, and RunPod's Python SDK none for v2's headers.

    http = RunPodHTTP(key, timeout_s=30.0)
    answer = http.request("GET", "https://api.runpod.io/v2/pods", "list pods")
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Callable

import httpx

from raytrain.errors import RaytrainError

logger = logging.getLogger(__name__)

KEY_ENV = "RUNPOD_API_KEY"
KEY_FILE_ENV = "RUNPOD_API_KEY_FILE"
RETRIES_ON_429 = 4
MAX_WAIT_S = 60.0  # the longest single wait for a window or a Retry-After

_WINDOW = re.compile(r'"?(\w+)"?\s*;\s*r\s*=\s*(\d+)\s*;\s*t\s*=\s*(\d+)')


class RunPodError(RaytrainError):
    """A RunPod API call failed; the message says how to fix it."""


class RunPodAuthError(RunPodError):
    pass


class NoCapacity(RunPodError):
    pass


class RunPodUnavailable(RunPodError):
    pass


class RunPodRetired(RunPodError):
    """RunPod answered 410 Gone: the API raytrain called has been retired."""


def auth_error() -> RunPodAuthError:
    return RunPodAuthError(f"RunPod refused the API key. To fix: set {KEY_ENV} (or the file "
                           f"{KEY_FILE_ENV} names) to a current key from RunPod's console, "
                           "Settings, API Keys")


def used_up_for_s(header: str | None) -> float:
    """Seconds until every window the `RateLimit` header says is used up (r=0) resets; 0 when
    none is (or the header is absent, as for callers RunPod does not limit).

    >>> used_up_for_s('"minute";r=0;t=12, "hour";r=2800;t=1812')
    12.0
    """
    waits = [float(t) for _, r, t in _WINDOW.findall(header or "") if int(r) == 0]
    return max(waits, default=0.0)


def problem_text(answer: httpx.Response) -> str:
    """What a problem document (or any error answer) says, in one line of at most 300
    characters: its title, detail and each validation error."""
    try:
        document = answer.json()
    except ValueError:
        return answer.text.strip()[:300] or f"HTTP {answer.status_code}"
    if not isinstance(document, dict):
        return str(document)[:300]
    parts = [str(document.get(k)) for k in ("title", "detail") if document.get(k)]
    parts += [str(e) for e in document.get("errors") or [] if isinstance(e, str)]
    if not parts:  # not a problem document: the older APIs' {"error": ...} or {"message": ...}
        parts = [str(document.get("error") or document.get("message") or document)]
    return ": ".join(parts)[:300]


class RunPodHTTP:
    def __init__(self, key: str, timeout_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._http = httpx.Client(timeout=timeout_s, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        self.timeout_s = timeout_s
        self._sleep = sleep
        self._lock = threading.Lock()
        self._not_before = 0.0  # monotonic time before which no request goes (a used window)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, url: str, what: str, api: str,
                changes: str = "nothing was changed", **kwargs: Any) -> httpx.Response:
        """One call, paced by RunPod's rate limits; RunPodUnavailable when it gets no answer
        (or only 429s), RunPodAuthError for a refused key, RunPodRetired for a 410. Other
        answers are the caller's to read."""
        for attempt in range(RETRIES_ON_429 + 1):
            self._wait_for_window(what)
            try:
                answer = self._http.request(method, url, **kwargs)
            except httpx.TimeoutException:
                raise RunPodUnavailable(f"RunPod did not answer {what} within "
                                        f"{self.timeout_s:.0f} s. To fix: retry later; "
                                        f"{changes}") from None
            except httpx.HTTPError as exc:
                raise RunPodUnavailable(f"cannot reach RunPod for {what}: "
                                        f"{type(exc).__name__}. To fix: check this machine's "
                                        "network") from None
            self._note_window(answer)
            if answer.status_code != 429:
                break
            wait = _retry_after_s(answer)
            if attempt == RETRIES_ON_429:
                raise RunPodUnavailable(f"RunPod's rate limit refused {what} {attempt + 1} "
                                        f"times ({problem_text(answer)}). To fix: retry later, "
                                        "or run fewer clients on this API key")
            logger.warning("RunPod's rate limit: %s waits %.0f s (%s)", what, wait,
                           problem_text(answer))
            self._sleep(wait)
        if answer.status_code in (401, 403):
            raise auth_error()
        if answer.status_code == 410:
            raise RunPodRetired(f"RunPod has retired the API {api} that {what} used "
                                f"({problem_text(answer)}). To fix: upgrade raytrain to a "
                                "release that calls RunPod's current API")
        return answer

    def _wait_for_window(self, what: str) -> None:
        with self._lock:
            wait = self._not_before - time.monotonic()
        if wait > 0:
            logger.info("RunPod's rate limit: %s waits %.0f s for a window to reset", what,
                        wait)
            self._sleep(min(wait, MAX_WAIT_S))

    def _note_window(self, answer: httpx.Response) -> None:
        wait = min(used_up_for_s(answer.headers.get("RateLimit")), MAX_WAIT_S)
        if wait > 0:
            with self._lock:
                self._not_before = max(self._not_before, time.monotonic() + wait)


def _retry_after_s(answer: httpx.Response) -> float:
    try:
        seconds = float(answer.headers.get("Retry-After", ""))
    except ValueError:
        seconds = used_up_for_s(answer.headers.get("RateLimit")) or 1.0
    return min(max(seconds, 0.0), MAX_WAIT_S)
