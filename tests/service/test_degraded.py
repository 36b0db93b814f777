"""When the service's own disk stops taking writes mid-run, over real HTTP on 127.0.0.1 with
the real job manager and a real training loop (tests/fake_ray.TrainingRay): the job trains on
and ends SUCCEEDED, readiness says why it is not ready, writes are refused with 503 and change
nothing, reads keep working, and once the disk takes writes again the store holds what the
API said. The disk is made unwritable as an operator would find it: the state directory and
the job store's files immutable (`chattr +i`)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from raytrain.serve.jobs.store import JobStore
from raytrain.testing.fake_ray import TrainingRay
from raytrain.testing.http_service import served_training
from raytrain.testing.jobs import job


def _immutable(paths: list[Path], on: bool) -> None:
    subprocess.run(["chattr", "+i" if on else "-i", *map(str, paths)], check=True,
                   capture_output=True)


def _chattr_works(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.touch()
    try:
        _immutable([probe], True)
        _immutable([probe], False)
        return True
    except (OSError, subprocess.CalledProcessError):
        return False


@pytest.fixture
def frozen_state(tmp_path: Path) -> Iterator[tuple[Path, list[Path]]]:
    if shutil.which("chattr") is None or not _chattr_works(tmp_path):
        pytest.skip("this machine cannot make files immutable (chattr needs "
                    "CAP_LINUX_IMMUTABLE and a filesystem that supports it)")
    state = tmp_path / "state"
    paths = [state, state / "jobs.db", state / "jobs.db-journal"]
    yield state, paths
    _immutable([p for p in paths if p.exists()], False)


def test_an_unwritable_store_degrades_the_service_and_fails_no_job(
        frozen_state: tuple[Path, list[Path]]) -> None:
    """Without the buffer (serve.jobs.durable) the job's next report raises in rank 0 and the job
    ends FAILED; without the real write probe /readyz stays 200."""
    state, paths = frozen_state
    cluster = TrainingRay(cpus=1, hold_at=40)
    with served_training(state, cluster, scheduler_interval_s=0.05) as (url, token), \
            httpx.Client(base_url=url, timeout=30,
                         headers={"Authorization": f"Bearer {token}"}) as client:
        document = job(steps=120)
        job_id = client.post("/v1/jobs", json=document).json()["id"]
        assert cluster.held.wait(120), "the job did not reach step 40"
        _immutable([p for p in paths if p.exists()], True)
        cluster.go.set()  # it trains on, checkpoints and ends while the disk is frozen

        seen = []
        deadline = time.monotonic() + 180
        while True:
            status = client.get(f"/v1/jobs/{job_id}").json()  # reads keep working
            seen.append(status["state"])
            if status["state"] in ("SUCCEEDED", "FAILED"):
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert status["state"] == "SUCCEEDED", status["error"]
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "does not take writes" in ready.json()["status"]
        refused = client.post("/v1/jobs", json=document)
        assert refused.status_code == 503 and int(refused.headers["Retry-After"]) > 0
        assert "Nothing was changed" in refused.json()["detail"]
        assert client.post(f"/v1/jobs/{job_id}/resume", json={}).status_code == 503
        assert client.delete(f"/v1/jobs/{job_id}").status_code == 503
        assert client.delete(f"/v1/jobs/{job_id}?purge=true").status_code == 503
        assert [j["id"] for j in client.get("/v1/jobs").json()] == [job_id]

        _immutable([p for p in paths if p.exists()], False)
        deadline = time.monotonic() + 60
        while client.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert client.post("/v1/jobs", json=document).status_code == 202  # writes again
    kept = {status.id: status for status, _ in JobStore(state / "jobs.db").load_all()}
    assert kept[job_id].state.value == "SUCCEEDED"
    assert kept[job_id].result.steps == 120 and kept[job_id].checkpoint.step == 120
    assert "FAILED" not in seen
