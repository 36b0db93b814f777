"""/metrics as a Prometheus scraper reads it: counters that only grow (across a restart of the
job manager too), histograms, each job's series kept for the retention window after it ends,
and request latency by route. The tally's arithmetic is checked on plain values; the scrape
goes through the real app over a real job manager (on the recording fake of Ray)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from raytrain.core.tally import Tally
from raytrain.spec import JobState, JobStatus
from tests.support.service import Service, result, small_job


def scrape(service: Service) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = service.request("GET", "/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(answer.text)
            for sample in family.samples}


def test_a_scrape_counts_jobs_and_keeps_an_ended_jobs_series_for_the_retention(
        tmp_path: Path) -> None:
    service = Service(tmp_path, metrics_retention_s=600)
    done = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    service.cluster.advance(4.0)
    attempt = service.train(done, 60)  # checkpoints once, in 0.5 s
    service.manager.report_finished(done, attempt, result(60))
    service.cluster.finish(done)
    service.tick()
    cancelled = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.request("DELETE", f"/v1/jobs/{cancelled}")
    service.request("GET", f"/v1/jobs/{done}")
    seen = scrape(service)
    assert seen[("raytrain_jobs_submitted_total", ())] == 2
    assert seen[("raytrain_jobs_ended_total", (("state", "SUCCEEDED"),))] == 1
    assert seen[("raytrain_jobs_ended_total", (("state", "CANCELLED"),))] == 1
    assert seen[("raytrain_jobs_ended_total", (("state", "FAILED"),))] == 0
    assert seen[("raytrain_checkpoint_seconds_count", ())] == 1
    assert seen[("raytrain_checkpoint_seconds_sum", ())] == 0.5
    assert seen[("raytrain_queue_wait_seconds_count", ())] == 1
    assert seen[("raytrain_time_to_first_step_seconds_count", ())] == 1
    # the first step came 4 s after the capacity and 1 s of training: 5 s after submit
    assert seen[("raytrain_time_to_first_step_seconds_sum", ())] == 5.0
    labels = (("job", done), ("name", "tiny"), ("state", "SUCCEEDED"))
    assert seen[("raytrain_job_step", labels)] == 60
    assert seen[("raytrain_job_loss", labels)] == 5.0 - 60 / 100
    latency = {key for key in seen if key[0] == "raytrain_http_request_duration_seconds_count"}
    routes = {dict(labels)["route"] for _, labels in latency}
    assert "/v1/jobs/{job_id}" in routes and not any(done in r for r in routes)

    service.cluster.advance(601.0)  # past the retention: the job's series go, counters stay
    seen = scrape(service)
    assert not any(name == "raytrain_job_step" for name, _ in seen)
    assert seen[("raytrain_jobs_submitted_total", ())] == 2
    # a new job manager on the same store carries the counters on, not from zero
    again = Service(tmp_path, cluster=service.cluster, metrics_retention_s=600)
    seen = scrape(again)
    assert seen[("raytrain_jobs_submitted_total", ())] == 2
    assert seen[("raytrain_jobs_ended_total", (("state", "SUCCEEDED"),))] == 1


def test_the_grafana_dashboard_reads_only_series_the_service_exports(tmp_path: Path) -> None:
    service = Service(tmp_path)
    service.request("POST", "/v1/jobs", json=small_job())
    text = service.request("GET", "/metrics").text
    exported = {name for family in text_string_to_metric_families(text)  # empty ones too
                for name in (family.name, *(sample.name for sample in family.samples))}
    dashboard = json.loads((Path(__file__).parents[2] / "cluster" /
                            "grafana-dashboard.json").read_text())
    read = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"raytrain_\w+", target["expr"])}
    assert read and read <= exported, read - exported


def test_openmetrics_is_served_to_a_scraper_that_asks_for_it(tmp_path: Path) -> None:
    answer = Service(tmp_path).request(
        "GET", "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert answer.headers["content-type"].startswith("application/openmetrics-text")
    assert answer.text.endswith("# EOF\n")


changes = st.lists(st.tuples(st.sampled_from(list(JobState)), st.integers(0, 2),
                             st.integers(0, 2), st.floats(0, 50)), max_size=30)


@given(changes)
def test_the_tally_counts_every_change_once_and_survives_the_store(
        walk: list[tuple[JobState, int, int, float]]) -> None:
    job = JobStatus.model_validate({"id": "j", "state": "PENDING", "spec": small_job(),
                                    "created_at": 0.0, "resources": {
                                        "offer": "aws/r/p3", "market": "spot", "nodes": 3,
                                        "usd_per_hour": 6.0}})
    tally = Tally()
    tally.observe(None, job, 0.0)
    ended = preempted = 0
    for state, preemptions, restarts, usd in walk:
        after = job.model_copy(update={
            "state": state, "preemptions": job.preemptions + preemptions,
            "restarts": job.restarts + restarts, "cost_usd": job.cost_usd + usd})
        tally.observe(job, after, 1.0)
        ended += after.state.is_terminal and not job.state.is_terminal
        preempted += preemptions
        job = after
    assert tally.counters["jobs_submitted"] == 1
    assert sum(tally.ended.values()) == ended
    assert tally.counters["preemptions"] == preempted == job.preemptions
    assert tally.counters["spent_usd"] == pytest.approx(job.cost_usd)
    # The spot exposure the policy's rate comes from: 3 nodes at $2 each per hour.
    count, node_hours = tally.spot.get("aws/r/p3", (0, 0.0))
    assert count == job.preemptions and node_hours == pytest.approx(job.cost_usd / 2.0)
    assert Tally.from_json(json.loads(json.dumps(tally.to_json()))) == tally
