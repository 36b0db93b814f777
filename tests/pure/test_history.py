"""Each job's progress history: bounded by even thinning, durable across a restarted job
manager, served at /v1/jobs/{id}/history; and the dashboard's files and the API's documents
served from the package with nothing fetched from elsewhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytrain.serve.http.dashboard import WEB
from raytrain.serve.jobs import history
from raytrain.serve.jobs.history import History, stride_of, thinned
from raytrain.serve.jobs.store import JobStore
from tests.support.service import Service, progress, small_job


@given(st.integers(0, 5000), st.integers(2, 400))
def test_thinning_keeps_an_even_spread_from_the_first_to_the_latest(n: int,
                                                                     limit: int) -> None:
    numbers = list(range(n))
    kept, stride = thinned(numbers, limit, 1)
    assert len(kept) <= limit and kept == sorted(set(kept)) and set(kept) <= set(numbers)
    if n:
        assert kept[0] == 0 and kept[-1] == n - 1
    if len(kept) > 2:  # two points say nothing of the stride (a limit of 2)
        assert stride_of(kept) == stride  # what a restarted service reads back
    if n <= limit:
        assert kept == numbers and stride == 1
    elif len(kept) > 2:
        assert {b - a for a, b in zip(kept, kept[1:-1])} == {stride}
        assert len(kept) > limit // 2  # the stride only doubles as far as it must


def test_a_long_history_stays_bounded_in_memory_and_in_the_store(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    kept = History(store, limit=100)
    for step in range(1, 1001):
        kept.add("a", {"time": float(step), "step": step, "loss": 1.0 / step})
        if step % 7 == 0:
            kept.save("a")
    kept.save("a")
    again = History(JobStore(tmp_path / "jobs.db"), limit=100)
    steps = [p["step"] for p in _points(again, "a")]
    assert steps == [p["step"] for p in _points(kept, "a")]
    assert len(store.points("a")) == len(steps) <= 100
    assert steps[0] == 1 and steps[-1] == 1000 and steps == sorted(steps)
    gaps = {b - a for a, b in zip(steps, steps[1:-1])}
    assert gaps == {16}  # 1000 reports: one in 16, old and new alike
    # The job ends with a report not yet saved: it is written as its memory is let go (and
    # takes the place of the previous latest, which was off the stride).
    kept.add("a", {"time": 1001.0, "step": 1001, "loss": 0.001})
    kept.save("a", release=True)
    assert [p["step"] for p in _points(kept, "a")] == steps[:-1] + [1001]


def _points(kept: History, job_id: str) -> list[dict]:
    return json.loads(kept.json(job_id))["points"]


def test_the_history_survives_a_restarted_manager_and_goes_with_the_job(
        tmp_path: Path) -> None:
    service = Service(tmp_path)
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    service.train(job_id, steps=12)
    live = [e for e in service.recorded(job_id) if e["type"] == "progress"]
    assert {"cost_usd", "usd_per_hour"} <= live[-1]["data"].keys()  # for live charts
    answer = service.request("GET", f"/v1/jobs/{job_id}/history").json()
    assert [p["step"] for p in answer["points"]] == list(range(1, 13))
    assert answer["points_kept"] == history.POINTS_KEPT
    assert [p["time"] for p in answer["points"]] == [e["time"] for e in live]

    service.manager.shutdown()  # the service stops; a new manager reads the same store
    restarted = Service(tmp_path, cluster=service.cluster)
    again = restarted.request("GET", f"/v1/jobs/{job_id}/history").json()
    assert [p["step"] for p in again["points"]] == list(range(1, 13))
    assert again["points"][-1]["loss"] == answer["points"][-1]["loss"]
    assert restarted.request("GET", "/v1/jobs/nope/history").status_code == 404

    restarted.request("DELETE", f"/v1/jobs/{job_id}")
    restarted.tick()
    assert restarted.request("DELETE", f"/v1/jobs/{job_id}",
                             params={"purge": "true"}).status_code == 200
    assert JobStore(tmp_path / "jobs.db").points(job_id) == []


def test_the_pages_load_only_what_the_package_ships(tmp_path: Path) -> None:
    """/, /docs and /redoc name no other host: they work offline and behind a firewall."""
    service = Service(tmp_path)
    for page in ("/", "/docs", "/redoc"):
        answer = service.request("GET", page, token=None)
        assert answer.status_code == 200, page
        assert not re.findall(r"(?:src|href)=[\"']?(?:https?:)?//", answer.text), page
        for asset in re.findall(r"(?:src|href)=[\"']?(/(?:ui/|redoc)[^\"' >]+)",
                                answer.text) + re.findall(r"url: *'(/[^']+)'", answer.text):
            served = service.request("GET", asset, token=None)
            assert served.status_code == 200, asset
            # Nor does a script they load reach another host for an image (ReDoc's footer).
            assert b"cdn.redoc.ly" not in served.content, asset
    assert "default-src 'self'" in service.request("GET", "/", token=None).headers[
        "content-security-policy"]
    vendored = {p.name for p in (WEB / "vendor").iterdir()}
    for library in ("uPlot", "js-yaml", "swagger-ui", "redoc"):
        assert f"{library}.LICENSE" in vendored, library
    # test_install.py checks that an installed package carries them.


def test_every_step_is_kept_in_pages_whatever_the_report_rate(tmp_path: Path) -> None:
    """60 steps in 14 reports (rank 0 batches the steps since its last report): the history
    holds all 60, served in pages, kept across a restart; a step done again replaces its row.
    (Without the manager passing `steps` on, the answer holds none.)"""
    service = Service(tmp_path)
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    attempt = service.manager.worker_group_started(
        job_id, 0, {"placement_group": "pg-1", "accelerator": "cpu", "nodes": 1})
    reported = [0, 1, 2, 5, 9, 14, 20, 27, 33, 40, 46, 51, 55, 58, 60]
    for before, step in zip(reported, reported[1:]):
        service.cluster.advance(1.0)
        rows = [[s, 5.0 - s / 100, 1e-3 * s, 0.5, 4096] for s in range(before + 1, step + 1)]
        service.manager.report_progress(job_id, attempt, {
            **progress(step), "steps": rows,
            "fsdp_units": "4 x LlamaDecoderLayer, then the rest at the root"})
    service.manager.report_checkpoint(job_id, attempt, 60, "/ckpt/60", 0.5)
    answer = service.request("GET", f"/v1/jobs/{job_id}/history").json()
    assert [s["step"] for s in answer["steps"]] == list(range(1, 61))
    assert answer["steps"][19] == {"step": 20, "loss": 4.8, "lr": 0.02, "grad_norm": 0.5,
                                   "tokens": 4096}
    assert answer["next_after_step"] is None
    assert len(answer["points"]) == 14  # the chart's points: one a report
    status = service.request("GET", f"/v1/jobs/{job_id}").json()
    assert "steps" not in status["progress"]  # the status stays small
    assert status["progress"]["fsdp_units"] == "4 x LlamaDecoderLayer, then the rest at the root"

    service.manager.shutdown()
    restarted = Service(tmp_path, cluster=service.cluster)
    pages, after = [], -1
    while after is not None:
        page = restarted.request("GET", f"/v1/jobs/{job_id}/history",
                                 params={"after_step": after, "max_steps": 25}).json()
        pages.append([s["step"] for s in page["steps"]])
        after = page["next_after_step"]
    assert pages == [list(range(1, 26)), list(range(26, 51)), list(range(51, 61))]
    kept = History(JobStore(tmp_path / "jobs.db"))
    kept.add_steps(job_id, [(30, 9.0, 0.1, 1.0, 4096)])  # done again after a restart
    kept.save(job_id)
    again = json.loads(kept.json(job_id))["steps"]
    assert len(again) == 60 and again[29]["loss"] == 9.0


@pytest.mark.parametrize("end", ["stop", "cut"])
def test_a_run_that_ends_early_reports_its_last_steps(tmp_path: Path, end: str) -> None:
    """A run stopped by the service (a cancel) or cut short (stop_after_steps), with a report
    interval longer than the run: its last publication carries every step up to the one it
    ended at (the meter published only every interval and at the job's last step, so a cancel
    at step 300 left 296-300 in no history)."""
    from raytrain.core.resolve import job_layout
    from raytrain.spec import JobSpec
    from raytrain.testing.jobs import RecordingSink, job
    from raytrain.train.loop import train
    from raytrain.train.rank import WorkerInfo

    spec = JobSpec.model_validate(job(steps=12))
    sink = RecordingSink(stop_at_step=1 if end == "stop" else None)
    result = train(spec, WorkerInfo.single_process(), sink, tmp_path / "ckpt",
                   layout=job_layout(spec), progress_interval_s=3600.0,
                   **({"stop_after_steps": 5} if end == "cut" else {}))
    assert 1 <= result["steps"] < 12
    assert sorted(sink.step_rows()) == list(range(1, result["steps"] + 1))
    assert sink.reports[-1]["step"] == result["steps"]
