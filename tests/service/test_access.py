"""Who may call the API, and how much of it: tokens, rotation, idempotent submits and the
job limit, through the real app over a real job manager (on the recording fake of Ray).
The same token checks run against the deployed service in tests/service/ray/test_service.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from fastapi import HTTPException

from raytrain import api_tokens as tokens
from raytrain.api_tokens import client_token, digest, is_loopback, read_tokens, set_token
from raytrain.client import Client
from raytrain.errors import NotAuthorizedError, ServiceUnreachableError
from raytrain.serve.http.auth import (
    GUESSES_ALLOWED,
    SLOWED_CHECK_EVERY_S,
    AuthPace,
    caller_of,
    operator_token,
)
from raytrain.serve.http.limits import MAX_BODY_BYTES, MAX_STREAMS_PER_JOB, StreamLimits
from raytrain.spec import JobStatus, ServiceConfig
from raytrain.testing.http_service import free_port, served
from tests.support.service import Service, small_job

# Rotations show at once here; the pace of guesses has its own test below.
AT_ONCE = AuthPace(refresh_s=0.0, guesses_allowed=100)


def job_count(service: Service) -> int:
    return len(service.request("GET", "/v1/jobs").json())


def test_every_route_but_healthz_needs_a_valid_token_and_a_refusal_does_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = Service(tmp_path, auth_pace=AT_ONCE)
    path = tmp_path / "tokens.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert service.request("GET", "/healthz", token=None).status_code == 200
    for token in (None, "rt_guess", service.token[:-1]):
        for method, route in (("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/metrics"),
                              ("GET", "/v1/jobs/x/history"),
                              ("DELETE", "/v1/jobs/x"), ("GET", "/v1/jobs/x/events")):
            answer = service.request(method, route, token=token, json=small_job())
            assert answer.status_code == 401, (method, route, answer.text)
            assert answer.headers["www-authenticate"].startswith("Bearer")
            assert "RAYTRAIN_TOKEN" in answer.json()["detail"]
            # A token sent and refused is told so, not asked for one.
            assert ("did not accept the token" in answer.json()["detail"]) == bool(token)
        # Readiness is open to probes, and says nothing more without a token.
        ready = service.request("GET", "/readyz", token=token)
        assert ready.status_code == 200 and set(ready.json()) == {"ready", "status", "version"}
    assert job_count(service) == 0  # nothing was queued
    assert "store" in service.request("GET", "/readyz").json()  # a token holder sees more
    assert service.request("GET", "/metrics").status_code == 200
    # The dashboard's page and files, and the API's documents, hold no job's data: open.
    assert service.request("GET", "/healthz", token=None).json()["auth"] is True
    for page in ("/", "/ui/app.js", "/ui/vendor/uPlot.iife.min.js", "/docs", "/redoc",
                 "/openapi.json"):
        assert service.request("GET", page, token=None).status_code == 200, page
    from raytrain.cli.service_commands import serving_banner

    banner = serving_banner("http://127.0.0.1:8000", auth=True)  # as `raytrain serve` says
    assert "/openapi.json, open to all" in banner and "with a token" not in banner
    opened = Service(tmp_path / "open-metrics", open_metrics=True, auth_pace=AT_ONCE)
    assert opened.request("GET", "/metrics", token=None).status_code == 200
    assert opened.request("GET", "/v1/jobs", token=None).status_code == 401


def test_jobs_record_whose_token_submitted_them_and_rotation_keeps_them(
        tmp_path: Path) -> None:
    service = Service(tmp_path, auth_pace=AT_ONCE)
    alice = set_token(tmp_path, "alice")
    job = service.request("POST", "/v1/jobs", token=alice, json=small_job()).json()
    assert job["submitted_by"] == "alice"
    rotated = set_token(tmp_path, "alice", "rotate")
    assert service.request("GET", "/v1/jobs", token=alice).status_code == 401
    assert service.request("GET", f"/v1/jobs/{job['id']}", token=rotated).json()["state"] == \
        "PENDING"
    set_token(tmp_path, "alice", "remove")
    assert service.request("GET", "/v1/jobs", token=rotated).status_code == 401
    assert service.request("GET", "/v1/jobs").json()[0]["id"] == job["id"]  # nothing lost
    assert read_tokens(tmp_path).keys() == {"operator"}


def test_an_open_service_needs_no_token_and_records_no_one(tmp_path: Path) -> None:
    service = Service(tmp_path, auth=False, auth_pace=AT_ONCE)
    answer = service.request("POST", "/v1/jobs", token=None, json=small_job())
    assert answer.status_code == 202 and answer.json()["submitted_by"] is None


def test_a_retried_submit_returns_the_first_job_and_a_reused_key_is_refused(
        tmp_path: Path) -> None:
    service = Service(tmp_path, auth_pace=AT_ONCE)
    first = service.request("POST", "/v1/jobs", json=small_job(),
                            headers={"Idempotency-Key": "k-1"})
    again = service.request("POST", "/v1/jobs", json=small_job(),
                            headers={"Idempotency-Key": "k-1"})
    assert first.status_code == again.status_code == 202
    assert first.json()["id"] == again.json()["id"] and job_count(service) == 1
    other = small_job()
    other["training"]["steps"] = 7
    clash = service.request("POST", "/v1/jobs", json=other, headers={"Idempotency-Key": "k-1"})
    assert clash.status_code == 409 and "new key" in clash.json()["detail"]
    # another caller's key is its own
    bob = set_token(tmp_path, "bob")
    mine = service.request("POST", "/v1/jobs", token=bob, json=small_job(),
                           headers={"Idempotency-Key": "k-1"})
    assert mine.json()["id"] != first.json()["id"] and job_count(service) == 2
    # a day later the key is free again
    service.cluster.advance(24 * 3600 + 1)
    later = service.request("POST", "/v1/jobs", json=small_job(),
                            headers={"Idempotency-Key": "k-1"})
    assert later.json()["id"] != first.json()["id"]


def test_the_client_retries_reads_and_keyed_submits_through_a_restart_but_not_a_cancel(
        tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with pytest.raises(ServiceUnreachableError):  # never answered: a wrong address, at once
        Client(url, token="t").list()
    assert time.monotonic() - started < 5
    client = Client(url, token=operator_token(ServiceConfig(state_dir=str(tmp_path))))
    with served(tmp_path, port=port, auth_pace=AT_ONCE):
        first = client.submit(small_job())
    with pytest.raises(ServiceUnreachableError):  # a cancel is not repeated: it fails at once
        client.cancel(first.id)
    up = threading.Event()

    def restart() -> None:  # the service comes back a second after the client asks
        time.sleep(1.0)
        with served(tmp_path, port=port, auth_pace=AT_ONCE):
            up.set()
            time.sleep(30)

    threading.Thread(target=restart, daemon=True).start()
    second = client.submit(small_job())  # sent while nothing listened: retried, queued once
    listed = [j.id for j in client.list()]  # (one creation time here: listed by id)
    assert up.is_set() and sorted(listed) == sorted([first.id, second.id])


def test_the_service_takes_no_more_than_max_active_jobs(tmp_path: Path) -> None:
    service = Service(tmp_path, max_active_jobs=2, auth_pace=AT_ONCE)
    ids = [service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
           for _ in range(2)]
    busy = service.request("POST", "/v1/jobs", json=small_job())
    assert busy.status_code == 429 and int(busy.headers["retry-after"]) > 0
    assert "max_active_jobs=2" in busy.json()["detail"] and job_count(service) == 2
    service.request("DELETE", f"/v1/jobs/{ids[0]}")  # one ends: room for another
    assert service.request("POST", "/v1/jobs", json=small_job()).status_code == 202


def test_event_streams_are_limited_per_job_and_in_all() -> None:
    limits = StreamLimits(per_job=2, total=3)
    with limits.held("a"), limits.held("a"):
        with pytest.raises(HTTPException) as caught:
            limits.admit("a")
        assert caught.value.status_code == 429 and "2 on this job" in caught.value.detail
        with limits.held("b"):
            with pytest.raises(HTTPException):
                limits.admit("c")
    release = limits.admit("a")  # all closed again
    release()
    release()  # gives the slot back once, however often it is called
    assert not limits.open
    one_job = StreamLimits(per_job=5, total=10, jobs=1)
    with one_job.held("a"):
        with pytest.raises(HTTPException) as caught:
            one_job.admit("b")
        assert "1 jobs followed at once" in caught.value.detail


def test_concurrent_streams_get_exactly_their_slots_and_give_them_back(tmp_path: Path) -> None:
    """100 streams on one job opened at once over real HTTP: exactly MAX_STREAMS_PER_JOB are
    admitted (when the count went up only once a stream started, 81 of 1,000 were), and once
    every client has gone, as many are admitted again. A body sent in chunks without a length
    is refused over MAX_BODY_BYTES with 413, as a declared one is."""
    with served(tmp_path, auth_pace=AT_ONCE) as (url, token):
        headers = {"Authorization": f"Bearer {token}"}
        job_id = httpx.post(f"{url}/v1/jobs", json=small_job(), headers=headers).json()["id"]

        async def open_all(count: int) -> list[int]:
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60,
                                         limits=httpx.Limits(max_connections=None)) as client:
                async with contextlib.AsyncExitStack() as stack:
                    async def one() -> int:
                        response = await stack.enter_async_context(
                            client.stream("GET", f"/v1/jobs/{job_id}/events"))
                        return response.status_code

                    return list(await asyncio.gather(*(one() for _ in range(count))))

        codes = asyncio.run(open_all(MAX_STREAMS_PER_JOB + 36))
        assert codes.count(200) == MAX_STREAMS_PER_JOB and codes.count(429) == 36
        deadline = time.monotonic() + 60  # the replica hears of each client's leaving
        while sorted(again := asyncio.run(open_all(MAX_STREAMS_PER_JOB + 36))) != sorted(codes):
            assert time.monotonic() < deadline, f"slots not given back: {again.count(200)}"
            time.sleep(0.5)

        def chunks() -> Iterator[bytes]:
            for _ in range(3):
                yield b" " * (MAX_BODY_BYTES // 2)

        response = httpx.post(f"{url}/v1/jobs", content=chunks(), headers=headers)
        assert response.status_code == 413 and "1 MiB" in response.json()["detail"]
        assert [j["id"] for j in httpx.get(f"{url}/v1/jobs", headers=headers).json()] == [job_id]


def test_the_token_check_compares_every_token_and_names_the_caller() -> None:
    known = {"alice": digest("rt_a"), "bob": digest("rt_b")}
    assert caller_of("rt_b", known) == "bob" and caller_of("rt_c", known) is None


def test_the_client_sends_the_local_token_only_to_this_machine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = Service(tmp_path, auth_pace=AT_ONCE)
    monkeypatch.delenv("RAYTRAIN_TOKEN", raising=False)
    monkeypatch.setenv("RAYTRAIN_STATE_DIR", str(tmp_path))
    assert client_token("http://127.0.0.1:8000") == service.token
    assert client_token("http://10.1.2.3:8000") is None
    monkeypatch.setenv("RAYTRAIN_TOKEN", "rt_env")
    assert client_token("http://10.1.2.3:8000") == "rt_env"
    monkeypatch.delenv("RAYTRAIN_TOKEN")

    refused = Client("http://10.1.2.3:8000", token="rt_wrong")
    assert refused._http.headers["authorization"] == "Bearer rt_wrong"  # noqa: SLF001
    with pytest.raises(NotAuthorizedError):
        Client._raise_for(httpx.Response(401, json={"detail": "no"}), None)  # noqa: SLF001


def test_the_token_command_adds_rotates_and_removes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from raytrain.cli import main

    state = ["--state-dir", str(tmp_path)]
    assert main(["token", "add", "alice", *state]) == 0
    first = capsys.readouterr().out.strip()
    assert read_tokens(tmp_path)["alice"] == first and first.startswith("rt_")
    assert main(["token", "add", "alice", *state]) == 1  # exists: rotate it instead
    assert "raytrain token rotate" in capsys.readouterr().err
    assert main(["token", "rotate", "alice", *state]) == 0
    assert capsys.readouterr().out.strip() not in ("", first)
    assert main(["token", "list", *state]) == 0
    assert capsys.readouterr().out.split() == ["alice"]
    assert main(["token", "remove", "bob", *state]) == 1
    assert main(["token", "remove", "alice", *state]) == 0
    assert read_tokens(tmp_path) == {}
    assert main(["token", "add", "no spaces", *state]) == 1


def test_serve_refuses_to_run_open_beyond_loopback(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from raytrain.cli import main

    assert main(["serve", "--no-auth", "--host", "0.0.0.0", "--port", "8765"]) == 1
    assert "loopback" in capsys.readouterr().err
    # A name is judged by the addresses it resolves to, not by its spelling; one that does
    # not resolve is said to be that, not a port in use. The resolver here answers for
    # three names of its own, so the test asks no DNS server.
    answers = {"127.0.0.1.public.test": "93.184.216.34", "here.test": "127.0.0.1"}

    def resolve(host: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    assert not is_loopback("127.0.0.1.public.test") and is_loopback("here.test")
    assert is_loopback("127.8.9.10") and is_loopback("::1") and not is_loopback("10.0.0.1")
    assert is_loopback("localhost") and not is_loopback("nowhere.test")
    assert main(["serve", "--no-auth", "--host", "127.0.0.1.public.test", "--port",
                 "8765"]) == 1
    assert "loopback" in capsys.readouterr().err
    assert main(["serve", "--no-auth", "--host", "nowhere.test", "--port", "8765"]) == 1
    assert "does not resolve" in capsys.readouterr().err


def test_guessing_is_slowed_and_seen_but_the_token_holder_gets_in(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Past GUESSES_ALLOWED refusals an address gets one token check a second (429 with
    Retry-After for the rest, the token not compared); each refusal is counted in /metrics
    and logged at WARNING with the address, never the token. Without the pace, every guess
    is a 401; without the log (it was INFO), nothing is seen at the kept level."""
    caplog.set_level(logging.WARNING, logger="raytrain.serve.http.auth")
    with served(tmp_path) as (url, token):
        guesses = [httpx.get(f"{url}/v1/jobs", headers={
            "Authorization": f"Bearer rt_guess{n:04d}"}) for n in range(GUESSES_ALLOWED + 30)]
        codes = [g.status_code for g in guesses]
        assert codes[:GUESSES_ALLOWED] == [401] * GUESSES_ALLOWED
        assert codes.count(429) >= 25 and codes.count(401) <= GUESSES_ALLOWED + 5
        slowed = next(g for g in guesses if g.status_code == 429)
        assert 1 <= int(slowed.headers["retry-after"]) <= 2
        holder = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 10  # the holder behind the same address, retrying
        while (mine := httpx.get(f"{url}/v1/jobs", headers=holder)).status_code == 429:
            assert time.monotonic() < deadline
            time.sleep(float(mine.headers["retry-after"]))
        assert mine.status_code == 200
        time.sleep(SLOWED_CHECK_EVERY_S)
        metrics = httpx.get(f"{url}/metrics", headers=holder).text
    refused = {line.split("{")[1].split("}")[0]: float(line.split()[-1])
               for line in metrics.splitlines()
               if line.startswith("raytrain_http_auth_refusals_total{")}
    assert refused['reason="invalid_token"'] == codes.count(401)
    assert refused['reason="slowed"'] >= codes.count(429)
    # ... and a request with no token is no guess: always the plain 401, never slowed
    with served(tmp_path / "again") as (url, token):
        bare = [httpx.get(f"{url}/v1/jobs").status_code for _ in range(GUESSES_ALLOWED + 5)]
        assert bare == [401] * len(bare)
    logged = [r.getMessage() for r in caplog.records if "no valid token" in r.getMessage()]
    assert len(logged) == codes.count(401) and all("from 127.0.0.1" in m for m in logged)
    assert not any("rt_guess" in m or token in m for m in caplog.messages)


def test_the_serve_terminal_prints_a_line_per_change_not_per_poll() -> None:
    """A queued job whose position moves, or a running one whose step count grows, is the
    same line; a new state or new words are a new one."""
    from raytrain.cli.service_commands import what_changed

    def status(state: str, message: str) -> JobStatus:
        return JobStatus.model_validate({"id": "j", "state": state, "message": message,
                                         "spec": small_job(), "created_at": 0.0})

    queued = what_changed(status("PENDING", "queued, position 2 of 3: waiting for 4 CPU "
                                            "(2 free of 2)"))
    assert what_changed(status("PENDING", "queued, position 1 of 3: waiting for 4 CPU "
                                          "(0.5 free of 2)")) == queued
    assert what_changed(status("PENDING", "queued, position 1 of 3: waiting for its "
                                          "nodes")) != queued
    assert what_changed(status("PROVISIONING", "")) != what_changed(status("PENDING", ""))


def test_a_request_head_is_bounded_before_anything_reads_it(tmp_path: Path) -> None:
    """Over real HTTP: an 8 MB header, or 200 headers, get 431 (they got 200 after the whole
    head was buffered); a header at the limit's edge still passes."""
    with served(tmp_path, auth_pace=AT_ONCE) as (url, token):
        auth_header = {"Authorization": f"Bearer {token}"}
        big = httpx.get(f"{url}/v1/jobs", headers={**auth_header, "X-Big": "a" * 8_000_000})
        assert big.status_code == 431 and "64 KiB" in big.json()["detail"]
        many = httpx.get(f"{url}/v1/jobs", headers={
            **auth_header, **{f"X-H{n}": "1" for n in range(200)}})
        assert many.status_code == 431
        fine = httpx.get(f"{url}/v1/jobs", headers={**auth_header, "X-Ok": "a" * 32_000})
        assert fine.status_code == 200
        assert httpx.get(f"{url}/healthz").status_code == 200  # the server is unharmed


def test_a_second_shell_finds_the_token_with_only_the_state_dir_or_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`raytrain token` (a subprocess) writes where RAYTRAIN_STATE_DIR says; a client on this
    machine finds the operator token of a service started with --state-dir D from the port
    alone (the service noted D), or from RAYTRAIN_STATE_DIR."""
    import subprocess
    import sys

    home, state = tmp_path / "home", tmp_path / "D"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RAYTRAIN_TOKEN", raising=False)
    monkeypatch.delenv("RAYTRAIN_STATE_DIR", raising=False)
    added = subprocess.run([sys.executable, "-m", "raytrain.cli", "token", "add", "alice"],
                           env={**os.environ, "RAYTRAIN_STATE_DIR": str(state)},
                           capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    assert tokens.read_tokens(state)["alice"] == added.stdout.strip()
    assert not (home / ".raytrain" / "tokens.json").exists()
    operator = tokens.set_token(state, "operator")
    assert tokens.client_token("http://127.0.0.1:8123") is None  # nothing known of it yet
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir(mode=0o700)
    tokens.remember_service(8123, state)  # what `raytrain serve --state-dir D` does
    assert tokens.client_token("http://127.0.0.1:8123") == operator
    # noted in the user's runtime folder: D holds its service's state, ~/.raytrain nothing
    assert (tmp_path / "run" / "raytrain" / "services.json").is_file()
    assert not (home / ".raytrain").exists()
    assert tokens.client_token("http://127.0.0.1:8124") is None  # another service
    monkeypatch.setenv("RAYTRAIN_STATE_DIR", str(state))
    assert tokens.client_token("http://127.0.0.1:8124") == operator
    assert tokens.client_token("http://192.0.2.1:8123") is None  # never sent elsewhere


def test_the_serve_terminal_reads_the_operator_token_again_after_a_rotation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`raytrain serve`'s foreground lines go on after `raytrain token rotate operator`: the
    watcher, refused its old token, reads tokens.json again. Started with the old token, it
    prints the job submitted after the rotation; without the re-read it goes silent for good
    and the job's line never comes (the test fails)."""
    import signal

    from raytrain.cli.service_commands import _watch_until_signal

    config = ServiceConfig(state_dir=str(tmp_path))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    submitted: list[str] = []
    with served(tmp_path, auth_pace=AT_ONCE) as (url, old):

        def rotate_then_submit() -> None:
            time.sleep(1.0)  # the watcher has listed with the old token
            new = set_token(tmp_path, "operator", "rotate")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the service takes the new file in seconds
                answer = httpx.post(f"{url}/v1/jobs", json=small_job(),
                                    headers={"Authorization": f"Bearer {new}"})
                if answer.status_code == 202:
                    submitted.append(answer.json()["id"])
                    break
                time.sleep(0.2)
            time.sleep(3.0)  # a few of the watcher's passes
            os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C in the serve terminal

        helper = threading.Thread(target=rotate_then_submit)
        helper.start()
        try:
            _watch_until_signal(url, lambda: operator_token(config), interval_s=0.2)
        finally:
            helper.join(60)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        assert old != operator_token(config) and submitted
    printed = capsys.readouterr().err
    assert f"job {submitted[0]}" in printed, printed


def test_the_operator_token_is_written_before_the_service_answers(
        tmp_path: Path) -> None:
    """A script that waits for /healthz and then reads tokens.json must find the token:
    deploy() writes it before Serve starts the app (which answers /healthz at once). Serve
    is a stand-in that records whether tokens.json existed when the app was
    started; moving the token after serve.run makes this fail."""
    from raytrain.serve import deploy

    seen: dict[str, bool] = {}

    class Serve:
        def start(self, **_: Any) -> None:
            pass

        def run(self, *_: Any, **__: Any) -> None:
            seen["token"] = bool(read_tokens(tmp_path).get(tokens.OPERATOR))
            raise RuntimeError("stop here")  # the rest needs a cluster

    with pytest.raises(RuntimeError, match="stop here"):
        deploy.deploy(ServiceConfig(state_dir=str(tmp_path)), "127.0.0.1", free_port(),
                      serving=Serve(), application=lambda *_: None)
    assert seen == {"token": True}


def test_a_failed_deploy_shows_the_replicas_own_error_not_only_serves() -> None:
    from raytrain.serve.deploy_failure import deploy_failure

    traceback = ["Traceback (most recent call last):"] + [f"  frame {i}" for i in range(40)] \
        + ["ImportError: cannot import name '__version__' from 'raytrain'"]
    message = deploy_failure("Deploying application raytrain failed: Failed to update the "
                             "deployments ['RaytrainAPI']", ["RaytrainAPI: " +
                                                             "\n".join(traceback)])
    assert "ImportError: cannot import name '__version__'" in message
    assert "frame 39" in message and "frame 2\n" not in message  # the end, where the cause is
    assert "To fix" in message and "logs" in message
    assert "Failed to update" in deploy_failure("Failed to update the deployments", [])
