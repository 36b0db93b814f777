"""Who may call the API: bearer tokens, kept in the service's state directory.

The first start writes `tokens.json` (mode 0600) with one random token named "operator";
`raytrain token add NAME` gives a colleague their own, `raytrain token rotate NAME` replaces
one, `raytrain token remove NAME` withdraws it. The service reads the file again when it
changes, so a rotation takes effect within TOKEN_REFRESH_S without a restart and without
touching a job. Each job records the name of the token that submitted it.

Every endpoint but /healthz needs `Authorization: Bearer <token>` (/metrics too, unless the
operator opens it). A request without a valid one is answered 401 before its body is read,
and nothing about it but its path and address is logged. The presented token is hashed and
compared with every known token's hash in constant time (hmac.compare_digest), so neither
the answer nor its timing says how much of a guess was right.

Guessing is slowed and seen (Refusals): each refusal is logged at WARNING with the client's
address (never the token presented) and counted in /metrics
(raytrain_http_auth_refusals_total); an address refused GUESSES_ALLOWED times within
GUESS_WINDOW_S gets one token check per SLOWED_CHECK_EVERY_S until its refusals age out, the
rest answered 429 with Retry-After and their token not compared. A holder of a valid token
behind the same address still gets in at that pace, and from any other address at once.

Written here rather than with FastAPI's security helpers because the check must run before
the JSON body middleware reads a body, and on the event stream as on every other route.

    digests = token_digests(Path("~/.raytrain"))      # {"operator": sha256}, the file made once
    app.add_middleware(BearerAuth, ...)               # every route but /healthz checked

The token file itself, and how a client on this machine finds its token, are
raytrain.api_tokens (the client imports that, not this module).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from raytrain.api_tokens import OPERATOR, digest, ensure_tokens

logger = logging.getLogger(__name__)

TOKEN_REFRESH_S = 5.0
GUESS_WINDOW_S = 60.0
GUESSES_ALLOWED = 20  # refusals per address within GUESS_WINDOW_S before it is slowed
SLOWED_CHECK_EVERY_S = 1.0


@dataclass(frozen=True)
class AuthPace:
    """How often the tokens are read again, and how guessing is slowed (module doc)."""

    refresh_s: float = TOKEN_REFRESH_S
    guesses_allowed: int = GUESSES_ALLOWED


TRACKED_ADDRESSES = 10_000  # the oldest address is forgotten past this


class Refusals:
    """Refused token checks per client address, and the pace a guessing address is held to
    (pure: the caller gives the time)."""

    def __init__(self, guesses_allowed: int = GUESSES_ALLOWED) -> None:
        self.guesses_allowed = guesses_allowed
        self.recent: dict[str, deque[float]] = {}
        self.checked_at: dict[str, float] = {}

    def wait_s(self, address: str, now: float) -> float:
        """0 when this request's token may be checked now; else how long until it may."""
        times = self._aged(address, now)
        if times is None or len(times) < self.guesses_allowed:
            return 0.0
        wait = self.checked_at.get(address, -math.inf) + SLOWED_CHECK_EVERY_S - now
        if wait > 0:
            return wait
        self.checked_at[address] = now
        return 0.0

    def refused(self, address: str, now: float) -> int:
        """Count a refusal; how many this address has within the window."""
        times = self._aged(address, now)
        if times is None:
            if len(self.recent) >= TRACKED_ADDRESSES:
                oldest = next(iter(self.recent))
                self.recent.pop(oldest)
                self.checked_at.pop(oldest, None)
            times = self.recent[address] = deque()
        times.append(now)
        return len(times)

    def _aged(self, address: str, now: float) -> deque[float] | None:
        times = self.recent.get(address)
        while times and times[0] <= now - GUESS_WINDOW_S:
            times.popleft()
        if times is not None and not times:
            del self.recent[address]
            self.checked_at.pop(address, None)
            return None
        return times


def caller_of(presented: str, digests: dict[str, str]) -> str | None:
    """The name whose token was presented, or None. Compares against every known token, in
    constant time each, whatever matches first."""
    wanted = digest(presented)
    found = None
    for name, known in digests.items():
        if hmac.compare_digest(wanted, known):
            found = name
    return found


def operator_token(config: Any) -> str | None:
    """A token of the service configured by `config` (a ServiceConfig), for the process that
    started it on this machine: the operator's, else any; None when it runs open."""
    if not config.auth:
        return None
    tokens, _ = ensure_tokens(config.state_path)
    return tokens.get(OPERATOR) or next(iter(tokens.values()))


class BearerAuth:
    """ASGI middleware: every HTTP request but `open_paths` (and paths under
    `open_prefixes`) needs a known bearer token.

    `digests` is asked for {name: sha256 of token} at most every TOKEN_REFRESH_S; None from it
    means the service runs open (--no-auth on loopback). The caller's name goes in
    scope["state"]["caller"] for the routes.
    """

    def __init__(self, app: Any, digests: Callable[[], Awaitable[dict[str, str] | None]],
                 open_paths: frozenset[str], open_prefixes: tuple[str, ...] = (),
                 refused: Any = None, pace: AuthPace = AuthPace()) -> None:
        self.app = app
        self.digests = digests
        self.open_paths = open_paths
        self.open_prefixes = open_prefixes
        self.refused = refused  # a prometheus Counter labelled by reason, or None
        self.refusals = Refusals(pace.guesses_allowed)
        self.refresh_s = pace.refresh_s
        self._known: dict[str, str] | None = None
        self._fetched_at = -float("inf")

    async def _current(self) -> dict[str, str] | None:
        if time.monotonic() - self._fetched_at > self.refresh_s:
            try:
                self._known = await self.digests()
                self._fetched_at = time.monotonic()
            except Exception:  # the manager is away: keep the tokens last seen
                if self._fetched_at == -float("inf"):
                    raise
        return self._known

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in self.open_paths or \
                (path.startswith(self.open_prefixes) and ".." not in path):
            presented = _bearer(scope) if scope["type"] == "http" else ""
            if presented:  # an open route may say more to a token holder: who is it (never
                # refused, never counted)?
                try:
                    known = await self._current()
                except Exception:  # noqa: BLE001 - the manager is away: a stranger, for now
                    known = None
                scope.setdefault("state", {})["caller"] = \
                    caller_of(presented, known) if known is not None else None
            await self.app(scope, receive, send)
            return
        try:
            known = await self._current()
        except Exception:  # noqa: BLE001 - the manager away, whatever Ray raised
            await send_json(send, 503, "the job manager is not answering yet, so the token "
                            "cannot be checked. To fix: retry shortly", {b"retry-after": b"2"})
            return
        caller = None
        if known is not None:
            presented = _bearer(scope)
            if not presented:  # no token is no guess: always the plain 401, never slowed
                self._count("missing_token")
                await _refuse(send, "this service needs a token: send 'Authorization: Bearer "
                              "<token>'", b"")
                return
            address = (scope.get("client") or ("unknown",))[0]
            wait = self.refusals.wait_s(address, time.monotonic())
            if wait > 0:
                self._count("slowed")
                await send_json(send, 429, "too many requests with a wrong token from this "
                                f"address: one token check per {SLOWED_CHECK_EVERY_S:.0f} s "
                                "for now. To fix: send a valid token (raytrain token add NAME "
                                "on the service's machine gives one)",
                                {b"retry-after": str(math.ceil(wait)).encode()})
                return
            caller = caller_of(presented, known)
            if caller is None:
                count = self.refusals.refused(address, time.monotonic())
                self._count("invalid_token")
                logger.warning("refused %s %s from %s: no valid token (%d from this address "
                               "in %.0f s%s)", scope["method"], scope["path"], address, count,
                               GUESS_WINDOW_S, "; now slowed"
                               if count == self.refusals.guesses_allowed else "")
                await _refuse(send, "this service did not accept the token sent (wrong, "
                              "rotated or removed)", b', error="invalid_token"')
                return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)

    def _count(self, reason: str) -> None:
        if self.refused is not None:
            self.refused.labels(reason).inc()


async def _refuse(send: Any, why: str, error: bytes) -> None:
    await send_json(send, 401, why + ". To fix: set RAYTRAIN_TOKEN (or --token) to a current "
                    "token from the service's state directory (tokens.json), or ask its "
                    "operator for one (raytrain token add NAME)",
                    {b"www-authenticate": b'Bearer realm="raytrain"' + error})


def _bearer(scope: dict[str, Any]) -> str:
    """The bearer token a request presents ('' if none)."""
    header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, presented = header.partition(" ")
    return presented.strip() if scheme.lower() == "bearer" else ""


async def send_json(send: Any, status: int, detail: str,
                    headers: dict[bytes, bytes] | None = None) -> None:
    """Answer an ASGI request with `{"detail": detail}` (for middleware that answers before
    the app sees the request)."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            *(headers or {}).items()]})
    await send({"type": "http.response.body", "body": body})
