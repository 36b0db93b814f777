"""What `raytrain serve --detach` started, as recorded in `<state_dir>/service.json`, and the
signals that stop a process family: kept apart from raytrain.serve.deploy so that the CLI
answers "already running" and "nothing to stop" without importing Ray (seconds) first."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import psutil

from raytrain.errors import RaytrainError

SERVICE_RECORD = "service.json"


@dataclass(frozen=True)
class DetachedService:
    """What `serve --detach` started, for `raytrain stop`."""

    url: str
    address: str  # the Ray cluster's GCS address
    head_pid: int | None  # the `ray start --head --block` process we started, if any
    temp_dir: str | None  # that head's Ray session folder (its logs and sockets)
    started_at: float

    def save(self, state_dir: Path) -> Path:
        state_dir.mkdir(parents=True, exist_ok=True)
        path = state_dir / SERVICE_RECORD
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @staticmethod
    def load(state_dir: Path) -> DetachedService | None:
        try:
            return DetachedService(**json.loads((state_dir / SERVICE_RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def head_process(record: DetachedService) -> psutil.Process | None:
    """The head process the record names, if it still runs (and is still that process)."""
    if record.head_pid is None:
        return None
    try:
        proc = psutil.Process(record.head_pid)
        if "ray" in " ".join(proc.cmdline()) and proc.create_time() <= record.started_at + 5:
            return proc
    except psutil.Error:
        pass
    return None


def detached_service_running(state_dir: Path) -> DetachedService | None:
    """The detached service recorded in `state_dir`, if it still answers."""
    record = DetachedService.load(state_dir)
    if record is None:
        return None
    try:
        httpx.get(f"{record.url}/healthz", timeout=2.0)
        return record
    except httpx.HTTPError:
        return record if head_process(record) is not None else None


def recorded_service(state_dir: Path) -> DetachedService:
    """The record `raytrain stop` acts on; a RaytrainError saying how to fix it if none."""
    record = DetachedService.load(state_dir)
    if record is None:
        raise RaytrainError(
            f"nothing to stop: no service started with `raytrain serve --detach` is recorded "
            f"in {state_dir / SERVICE_RECORD}. To fix: pass the --state-dir it was started "
            "with")
    return record


def terminate_family(proc: psutil.Process, timeout_s: float = 30.0) -> None:
    """SIGTERM a process and its children, then SIGKILL what is left after timeout_s."""
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return
    for member in family:
        try:
            member.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(family, timeout=timeout_s)
    kill_all(alive)


def kill_all(procs: list[psutil.Process]) -> None:
    """SIGKILL each process and wait for them (up to 10 s)."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
