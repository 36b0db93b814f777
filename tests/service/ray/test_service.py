"""End to end over real HTTP on 127.0.0.1 against the real Serve app on a local Ray cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from raytrain import Client, JobState
from raytrain.cli import main as cli_main
from raytrain.testing.ray_service import (
    NUM_CPUS,
    Service,
    cpus_free,
    job_spec,
    train_worker_pids,
    wait_for,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[3]






def job_ids(service: Service) -> set[str]:
    return {job["id"] for job in service.http.get(f"{service.url}/v1/jobs").json()}


def test_bad_specs_answer_422_with_field_paths_and_start_nothing(service: Service) -> None:
    before = job_ids(service)  # jobs of earlier tests may still be ending: compare ids
    # Without a valid token nothing is read or queued; only /healthz answers.
    for headers in ({}, {"Authorization": "Bearer rt_wrong"}, {"Authorization": "Basic x"}):
        for method, route in (("POST", "/v1/jobs"), ("GET", "/v1/jobs"), ("GET", "/metrics")):
            refused = httpx.request(method, f"{service.url}{route}", headers=headers,
                                    json=job_spec(steps=3))
            assert refused.status_code == 401 and "To fix" in refused.text, (method, route)
    assert httpx.get(f"{service.url}/healthz").status_code == 200
    assert job_ids(service) == before
    cases = [
        ({"training": {"stepz": 3}}, ["body", "training", "stepz"]),
        ({"training": {"steps": -1}}, ["body", "training", "steps"]),
        ({"resources": {"num_workers": "two"}}, ["body", "resources", "num_workers"]),
        ({"parallel": {"dp_replicate": 4}}, ["body", "parallel", "dp_replicate"]),
        ({"model": {"kind": "import", "factory": "os:system"}}, ["body", "model", "factory"]),
        ({"parallel": {"strategy": "tensor"}, "resources": {"num_workers": 3}},
         ["body", "parallel", "tp"]),
    ]
    for body, loc in cases:
        response = service.http.post(f"{service.url}/v1/jobs", json=body)
        assert response.status_code == 422, body
        locs = [error["loc"] for error in response.json()["detail"]]
        assert loc in locs, (body, locs)
    # Fields that mean nothing for the kind, huge bodies, and huge values: refused, and the
    # answer never echoes more than an excerpt of what was sent.
    useless = service.http.post(f"{service.url}/v1/jobs", json={"data": {"path": "/x" * 100}})
    assert useless.status_code == 422
    assert ["body", "data", "path"] in [e["loc"] for e in useless.json()["detail"]]
    echoed = service.http.post(f"{service.url}/v1/jobs", json={"nope": "x" * 500_000})
    assert echoed.status_code == 422 and len(echoed.content) < 4000, len(echoed.content)
    huge = service.http.post(f"{service.url}/v1/jobs", content=b'{"name": "' + b"x" * 50 * 2**20
                      + b'"}', timeout=60)
    assert huge.status_code == 413 and len(huge.content) < 1000
    for resources in ({"num_workers": 4, "cpus_per_worker": 1}, {"cpus_per_worker": 64}):
        never = service.http.post(f"{service.url}/v1/jobs", json={"resources": resources,
                                                           "training": {"global_batch_size": 16}})
        assert never.status_code == 422, never.text
        assert "never" in never.text and "To fix" in never.text
    missing = service.http.post(f"{service.url}/v1/jobs", json={
        "data": {"kind": "token_file", "path": "/no/such/tokens.bin"}})
    assert missing.status_code == 422 and "To fix" in missing.json()["detail"][0]["msg"]
    assert job_ids(service) == before
    assert service.http.get(f"{service.url}/v1/jobs/nope").status_code == 404
    assert service.http.get(f"{service.url}/readyz").json()["ready"] is True
    # The planner over HTTP: ranked plans, or 422 with the smallest change that would fit.
    plans = service.http.post(f"{service.url}/v1/plans", json={
        "spec": job_spec(steps=10), "gpus": 8, "accelerator": "h100-sxm",
        "usd_per_gpu_hour": 2.0}).json()
    assert plans["gpus"] == 8 and plans["plans"][0]["rank"] == 1
    huge = {"model": {"gpt": {"dim": 8192, "num_layers": 80, "num_heads": 64}},
            "training": {"global_batch_size": 8, "micro_batch_size": 1}}
    refused = service.http.post(f"{service.url}/v1/plans",
                         json={"spec": huge, "gpus": 2, "accelerator": "rtx4090"})
    assert refused.status_code == 422 and "To fix" in refused.json()["detail"][0]["msg"]
    assert "/v1/jobs" in service.http.get(f"{service.url}/openapi.json").json()["paths"]


def snippets(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


@pytest.mark.timeout(400)  # two demo jobs
def test_the_readme_trains_the_demo_to_success_streaming_progress_then_cancels_one(
        service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    """Every Python snippet of the jobs guide runs, in order, against the deployed service
    (the README's is its first); the first one's job (the demo) is then checked through the
    API, the second one's cancelled."""
    first, second, *rest = snippets(ROOT / "docs" / "guides" / "jobs.md")
    assert not rest, "a new snippet in the jobs guide: run it here too"
    assert snippets(ROOT / "README.md") == [first]
    printed_at: list[tuple[float, tuple[Any, ...]]] = []

    def recording_print(*args: Any, **kwargs: Any) -> None:
        printed_at.append((time.time(), args))
        print(*args, **kwargs)

    namespace: dict[str, Any] = {"print": recording_print}
    submitted_at = time.time()
    for snippet in (first, second):
        code = snippet.replace("http://127.0.0.1:8000", service.url).replace(
            '"examples/', f'"{ROOT}/examples/')
        exec(compile(code, "README.md", "exec"), namespace)  # our own README's snippet
        if snippet is first:
            check_the_demo_succeeded(service, namespace["job"], printed_at, submitted_at)
    out = capsys.readouterr().out
    # The demo's two replicas are two replica groups: cancelled at step 20 on a busy host, the
    # second may not have started yet, so its log may be missing, never the first's to start.
    assert "SUCCEEDED" in out and re.search(r"^rank \d+:", out, re.M), out[-2000:]
    assert namespace["job"].wait().state == JobState.CANCELLED
    # The cancel stopped the workers and freed their CPUs.
    wait_for(lambda: not train_worker_pids(), 60, "the training workers to exit")
    wait_for(lambda: cpus_free() >= NUM_CPUS, 60, "the CPUs to be free again")


def check_the_demo_succeeded(service: Service, job: Any,
                             printed_at: list[tuple[float, tuple[Any, ...]]],
                             submitted_at: float) -> None:
    demo = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())["training"]
    status = job.wait()  # already ended: replays the stream and returns
    assert status.state == JobState.SUCCEEDED, status.error
    assert status.submitted_by == "operator"
    states = [args[1]["state"] for _, args in printed_at if args[0] == "state"]
    # A queued job may say PENDING more than once (its place and reason in the queue).
    distinct = [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]
    assert distinct[:3] == ["PENDING", "PROVISIONING", "RUNNING"] and states[-1] == "SUCCEEDED"
    progress = [(at, args[1]) for at, args in printed_at if args[0] == "progress"]
    steps = [p["step"] for _, p in progress]
    assert steps == sorted(steps) and steps[-1] == demo["steps"]
    assert progress[-1][1]["loss"] < progress[0][1]["loss"]
    # What the service shows is at most (gap between reports) + (delivery lag) old.
    sent = [p["sent_at"] for _, p in progress]
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    lags = [at - p["sent_at"] for at, p in progress]
    assert max(gaps) + max(lags) < 2.0, f"reports {max(gaps):.2f} s apart, {max(lags):.2f} s late"
    assert status.result is not None and status.result.final_loss < status.result.first_loss
    assert status.checkpoint is not None and status.checkpoint.step == demo["steps"]
    assert Path(status.checkpoint.path, "COMMITTED").is_file()
    assert status.plan is not None and status.plan.layout.dp_replicate == 2
    assert status.plan.description == status.plan.layout.describe()
    assert status.plan.description.startswith("dp_replicate2 mb")
    assert status.plan.predicted_step_s > 0 and status.plan.measured_step_s > 0
    assert status.plan.backend == "gloo" and status.resources.accelerator == "cpu"
    assert status.restarts == 0 and status.error is None
    assert status.finished_at is not None and status.finished_at > submitted_at
    metrics = service.http.get(f"{service.url}/metrics").text
    assert 'raytrain_jobs{state="SUCCEEDED"}' in metrics
    # A bad event position is the client's mistake, not the server's.
    for kwargs in ({"params": {"after": "abc"}}, {"headers": {"Last-Event-ID": "xyz"}}):
        answer = service.http.get(f"{service.url}/v1/jobs/{job.id}/events", **kwargs)
        assert answer.status_code == 422 and "To fix" in answer.text
    # Each rank's output is kept with the job; deleting the ended job removes it all.
    client = Client(service.url)
    logs = client.logs(job.id)
    assert [r.rank for r in logs.ranks] == [0, 1] and "rank 0" in logs.ranks[0].text
    job_root = Path(status.checkpoint.path).parents[1]
    assert client.delete(job.id).id == job.id
    assert not job_root.exists()
    assert service.http.get(f"{service.url}/v1/jobs/{job.id}").status_code == 404


def test_cli_and_curl_example_against_the_server(
    service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**os.environ, "RAYTRAIN_SERVER": service.url}
    follow = subprocess.run(
        [sys.executable, "-m", "raytrain.cli", "submit", str(ROOT / "examples" / "job.json"),
         "--follow", "--json"],
        env=env, capture_output=True, text=True, timeout=200,
    )
    assert follow.returncode == 0, follow.stderr[-2000:]
    followed = json.loads(follow.stdout)
    assert followed["state"] == "SUCCEEDED" and followed["progress"]["step"] == 40
    # Each state change is a line, RUNNING too; the summary says which throughput it shows.
    lines = follow.stderr.splitlines()
    assert any("RUNNING" in line for line in lines), follow.stderr[-2000:]
    assert "the run's average" in follow.stderr

    assert cli_main(["--server", service.url, "status", followed["id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == followed["id"]
    assert cli_main(["--server", service.url, "status", followed["id"]]) == 0
    assert "ended" in capsys.readouterr().out  # no ETA on a finished job
    assert cli_main(["--server", service.url, "list", "--json"]) == 0
    assert followed["id"] in {j["id"] for j in json.loads(capsys.readouterr().out)}
    assert cli_main(["--server", service.url, "list"]) == 0
    assert followed["id"] in capsys.readouterr().out
    # Deleting checkpoints asks first; where no one can be asked, it needs --yes.
    assert cli_main(["--server", service.url, "delete", followed["id"]]) == 1
    assert "To fix: add --yes" in capsys.readouterr().err
    assert cli_main(["--server", service.url, "delete", followed["id"], "--yes"]) == 0
    assert "deleted" in capsys.readouterr().out
    assert cli_main(["--server", service.url, "status", "missing-id"]) == 1
    assert "no job with id 'missing-id'" in capsys.readouterr().err
    bad = ROOT / "tests" / "service" / "ray" / "bad.yaml"
    bad.write_text("training: {steps: -3}\n")
    try:
        assert cli_main(["--server", service.url, "submit", str(bad)]) == 2
        assert "training.steps" in capsys.readouterr().err
    finally:
        bad.unlink()
    assert cli_main(["--server", "http://127.0.0.1:9", "list"]) == 1
    assert "cannot reach the raytrain service" in capsys.readouterr().err


def test_a_local_run_reaches_nothing_beyond_this_machine(service: Service) -> None:
    """Every Python process of the local cluster recorded its connections beyond this machine
    (tests/netaudit) while the jobs above trained: there must be none, not even Ray's
    dashboard asking the cloud metadata address which cloud it runs on at the cluster's start
    (raytrain/serve/adaptors/ray_probe.py holds it at home; without it this log had two lines
    `ray-usage-probe ... dashboard.py ... ('169.254.169.254', 80)`)."""
    log = service.state_dir / "connections-beyond-this-machine.log"
    assert log.is_file(), "the connection audit did not run"
    assert log.read_text().splitlines() == []


def test_the_job_list_comes_in_pages_and_the_client_follows_them(service: Service) -> None:
    """Runs after the tests above, whose jobs fill the list; run alone, it makes its own."""
    while len(every := service.http.get(f"{service.url}/v1/jobs",
                                         params={"limit": 1000}).json()) < 2:
        client = Client(service.url)
        client.cancel(client.submit(job_spec(steps=2, name="page")).id)
    first = service.http.get(f"{service.url}/v1/jobs", params={"limit": 1})
    assert [j["id"] for j in first.json()] == [j["id"] for j in every[:1]]
    assert 'rel="next"' in first.headers["link"]
    rest = service.http.get(f"{service.url}/v1/jobs",
                     params={"limit": 1000, "after": first.headers["x-next-cursor"]})
    assert [j["id"] for j in first.json() + rest.json()] == [j["id"] for j in every]
    assert "x-next-cursor" not in rest.headers
    assert [j.id for j in Client(service.url).list()] == [j["id"] for j in every]
    state = every[0]["state"]  # whatever the oldest job ended as
    in_state = Client(service.url).list(states=[state])
    assert in_state and all(j.state.value == state for j in in_state)
    assert {j.id for j in in_state} == {j["id"] for j in every if j["state"] == state}
    assert service.http.get(f"{service.url}/v1/jobs", params={"limit": 0}).status_code == 422
