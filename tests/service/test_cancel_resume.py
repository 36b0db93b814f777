"""A cancelled job, resumed from the command line, as a user scripts it: the cancel
checkpoints where the job stopped (a resume redoes no step; before, the last periodic
checkpoint was all there was), `raytrain resume ID` prints the new job's id alone (as
`submit` does: `R=$(raytrain resume ID)`), resuming the same job again is refused while its
resume runs, and every step of both jobs is in their histories (`raytrain status ID
--steps`). On a service whose runs train for real, in this process (raytrain/testing/fake_ray.py),
with
its storage in a folder and in a bucket."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from raytrain.cli import main
from raytrain.testing.fake_ray import TrainingRay
from raytrain.testing.http_service import served_training
from raytrain.testing.jobs import job
from raytrain.testing.s3_server import job_storage
from tests.support.tolerances import LOGITS


def _wait_for(client: httpx.Client, job_id: str, states: set[str]) -> dict:
    deadline = time.monotonic() + 180
    while (status := client.get(f"/v1/jobs/{job_id}").json())["state"] not in states:
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    return status


@pytest.fixture(params=["folder", "bucket"])
def storage(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The service's storage: its state folder, or an S3 bucket (moto's server), whose
    checkpoint a resume must be able to find (it was looked for on the head's disk)."""
    with job_storage(request.param, "cancel-resume") as settings:
        yield settings


def test_a_cancelled_job_resumes_from_where_it_stopped_by_its_id(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, storage: dict[str, str]) -> None:
    cluster = TrainingRay(cpus=1, hold_at=17)
    document = job(steps=40)
    document["training"]["checkpoint_every_steps"] = 50  # the end only, unless cancelled
    with served_training(tmp_path / "state", cluster, scheduler_interval_s=0.05,
                         **storage) as (url, token), httpx.Client(
            base_url=url, timeout=30, headers={
                "Authorization": f"Bearer {token}"}) as client:
        monkeypatch.setenv("RAYTRAIN_TOKEN", token)
        job_id = client.post("/v1/jobs", json=document).json()["id"]
        assert cluster.held.wait(120), "the job did not reach step 17"
        assert main(["cancel", job_id, "--server", url]) == 0
        cluster.go.set()  # rank 0 hears the stop in the answer to its next report
        cancelled = _wait_for(client, job_id, {"CANCELLED"})
        deadline = time.monotonic() + 60
        while (cancelled := client.get(f"/v1/jobs/{job_id}").json())["checkpoint"] is None:
            assert time.monotonic() < deadline, "the cancel left no checkpoint"
            time.sleep(0.05)
        stopped_at = cancelled["checkpoint"]["step"]
        assert 17 <= stopped_at < 40
        assert cancelled["checkpoint"]["path"].startswith(storage.get("storage_path", "/"))
        capsys.readouterr()

        assert main(["resume", job_id, "--server", url]) == 0
        resumed_id = capsys.readouterr().out
        assert resumed_id.strip() and resumed_id == resumed_id.strip() + "\n"
        resumed_id = resumed_id.strip()
        assert main(["resume", job_id, "--server", url]) == 1  # it runs already
        assert f"already resumed as job {resumed_id}" in capsys.readouterr().err
        done = _wait_for(client, resumed_id, {"SUCCEEDED", "FAILED"})
        assert done["state"] == "SUCCEEDED", done["error"]

        capsys.readouterr()
        assert main(["status", job_id, "--steps", "--json", "--server", url]) == 0
        first = [row["step"] for row in json.loads(capsys.readouterr().out)]
        assert main(["status", resumed_id, "--steps", "--json", "--server", url]) == 0
        second = json.loads(capsys.readouterr().out)
        # The resumed job goes on from the cancel's checkpoint: no step redone, none skipped.
        assert first == list(range(1, stopped_at + 1))
        assert [row["step"] for row in second] == list(range(stopped_at + 1, 41))
        assert all(row["loss"] is not None and row["lr"] > 0 for row in second)


def test_raytrain_export_writes_any_checkpoint_as_a_folder_transformers_loads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, storage: dict[str, str]) -> None:
    """A kind 'hf' job checkpointed at steps 2 and 4: `raytrain export ID --to DIR` writes
    its latest as a folder whose logits in transformers are raytrain's at that checkpoint,
    `--step 2` the earlier one, and a step with no checkpoint is refused with the fix. The
    service writes the same folder in the job's storage (POST /v1/jobs/{id}/export, and
    `raytrain export ID --in-storage`), read back from there."""
    import torch

    from raytrain.cloud.object_store import open_store
    from raytrain.models.registry import build_model
    from raytrain.spec import JobSpec
    from raytrain.train.checkpoint import CheckpointManager
    from tests.support.hf_models import hf_job, hf_logits, make_folder

    document = hf_job(make_folder("llama", tmp_path / "llama"), steps=4)
    document["training"]["checkpoint_every_steps"] = 2
    with served_training(tmp_path / "state", TrainingRay(cpus=1), scheduler_interval_s=0.05,
                         **storage) as (url, token), httpx.Client(
            base_url=url, timeout=30, headers={
                "Authorization": f"Bearer {token}"}) as client:
        monkeypatch.setenv("RAYTRAIN_TOKEN", token)
        job_id = client.post("/v1/jobs", json=document).json()["id"]
        done = _wait_for(client, job_id, {"SUCCEEDED", "FAILED"})
        assert done["state"] == "SUCCEEDED", done["error"]
        capsys.readouterr()
        assert main(["export", job_id, "--server", url, "--to", str(tmp_path / "e4")]) == 0
        assert capsys.readouterr().out.strip() == str(tmp_path / "e4")
        assert main(["export", job_id, "--server", url, "--to", str(tmp_path / "e2"),
                     "--step", "2"]) == 0
        assert main(["export", job_id, "--server", url, "--to", str(tmp_path / "e3"),
                     "--step", "3"]) == 2
        refusal = capsys.readouterr().err
        assert "not a committed checkpoint" in refusal and "invalid export request" in refusal
        # The same, written by the service in the job's storage (POST /v1/jobs/{id}/export).
        answer = client.post(f"/v1/jobs/{job_id}/export", json={"step": 2}, timeout=120)
        assert answer.status_code == 200, answer.text
        in_storage = answer.json()
        assert in_storage["step"] == 2
        assert in_storage["path"].endswith(f"/{job_id}/exports/step_000000002")
        refused = client.post(f"/v1/jobs/{job_id}/export", json={"step": 3}, timeout=120)
        assert refused.status_code == 422 and "step" in refused.text, refused.text
        assert main(["export", job_id, "--server", url, "--in-storage"]) == 0
        assert capsys.readouterr().out.strip().endswith(f"/{job_id}/exports/step_000000004")
        stored = open_store(in_storage["path"])
        for key in stored.keys(""):
            assert stored.get_file(key, tmp_path / "stored" / key)
        latest = done["checkpoint"]["path"]
    spec = JobSpec.model_validate(document)
    model = build_model(spec.model, seed=0)
    CheckpointManager(latest.rpartition("/")[0], 0).load(
        latest, [model], [torch.optim.AdamW(model.parameters())])
    tokens = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours = model.eval()(tokens)
    assert torch.allclose(hf_logits(tmp_path / "e4", tokens), ours, atol=LOGITS, rtol=0)
    assert not torch.allclose(hf_logits(tmp_path / "e2", tokens), ours, atol=LOGITS, rtol=0)
    assert torch.equal(hf_logits(tmp_path / "stored", tokens), hf_logits(tmp_path / "e2", tokens))
