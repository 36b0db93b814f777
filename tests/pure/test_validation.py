"""The validation loss: a held-out share of a token file that training never reads, measured
every eval_every_steps and at the end, equal to a plain loop's mean over the held-out
windows with the weights of that step; in the job's status (under a pipeline too:
tests/ranks/test_validation_layouts.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raytrain.data.sources import build_source
from raytrain.data.validation import with_validation
from raytrain.models.registry import build_model
from raytrain.spec import JobSpec
from raytrain.testing.runs import run_single
from raytrain.train.checkpoint import CheckpointManager
from tests.support.service import Service, small_job
from tests.support.tolerances import SUM_ORDER


def job(path: Path, **data: object) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                          "max_seq_len": 16}},
        "data": {"kind": "token_file", "path": str(path), "seq_len": 16,
                 "validation": {"fraction": 0.25}, **data},
        "training": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 4,
                     "checkpoint_every_steps": 5, "eval_batches": 2, "learning_rate": 0.01},
        "resources": {"num_workers": 1}})


def tokens_file(folder: Path) -> Path:
    path = folder / "tokens.bin"
    np.random.default_rng(0).integers(0, 64, size=16 * 40 + 1).astype(np.uint16).tofile(path)
    return path


def test_the_validation_loss_is_a_plain_loops_over_the_held_out_windows(
        tmp_path: Path) -> None:
    spec = job(tokens_file(tmp_path), shuffle=True)
    sink = run_single(spec, tmp_path / "run")
    measured = {r["val_step"]: r["val_loss"] for r in sink.reports if "val_loss" in r}
    assert sorted(measured) == [5, 10]
    source, held = with_validation(spec.data, 64, build_source(spec.data, 64))
    assert source.num_windows == 30 and held is not None  # 40 windows, the last 10 held out
    model = build_model(spec.model)
    CheckpointManager(tmp_path / "run", 0).load(str(tmp_path / "run" / "step_000000010"),
                                                [model], [torch.optim.AdamW(model.parameters())])
    samples = torch.cat([source.window_rows([30 + j % 10 for j in range(8 * e, 8 * e + 8)])
                         for e in range(2)])
    with torch.no_grad():
        plain = F.cross_entropy(model(samples[:, :-1]).flatten(0, 1), samples[:, 1:].flatten())
    assert measured[10] == pytest.approx(float(plain), abs=SUM_ORDER)


def test_training_never_reads_a_held_out_window(tmp_path: Path) -> None:
    """Shuffled over many epochs, every training window is among the first 30 of 40."""
    spec = job(tokens_file(tmp_path), shuffle=True)
    source, _ = with_validation(spec.data, 64, build_source(spec.data, 64))
    from raytrain.core.shuffle import windows

    assert set(windows(range(3000), source.num_windows, True, 0).tolist()) == set(range(30))


def test_a_jobs_status_and_metrics_carry_its_validation_loss(tmp_path: Path) -> None:
    service = Service(tmp_path)
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    attempt = service.manager.worker_group_started(job_id, 0, {"nodes": 1})
    service.manager.report_progress(job_id, attempt, {
        "step": 5, "total_steps": 60, "loss": 4.0, "tokens_per_s": 100.0, "elapsed_s": 1.0,
        "val_loss": 4.5, "val_step": 5, "eval_s": 0.2})
    progress = service.request("GET", f"/v1/jobs/{job_id}").json()["progress"]
    assert (progress["val_loss"], progress["val_step"]) == (4.5, 5)
    assert progress["val_perplexity"] == pytest.approx(math.exp(4.5))
    metrics = service.request("GET", "/metrics").text
    assert f'raytrain_job_val_loss{{job="{job_id}"' in metrics
    assert f'raytrain_job_val_perplexity{{job="{job_id}"' in metrics
    # The chart's history keeps it with the point, for the dashboard's loss chart.
    points = service.request("GET", f"/v1/jobs/{job_id}/history").json()["points"]
    assert (points[-1]["val_loss"], points[-1]["val_step"]) == (4.5, 5)


def test_a_share_that_leaves_nothing_to_train_on_is_refused_at_submit(tmp_path: Path) -> None:
    """One window of data, half held out: nothing would be left to train on. The submit is
    refused naming data.validation.fraction, before any worker starts; two windows pass."""
    service = Service(tmp_path / "service")
    one = tmp_path / "one.bin"
    np.arange(17, dtype=np.uint16).tofile(one)  # seq_len 16: one window
    document = job(one, validation={"fraction": 0.5}).model_dump(mode="json")
    answer = service.request("POST", "/v1/jobs", json=document)
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", "data", "validation", "fraction"]
    assert "To fix" in error["msg"]
    two = tmp_path / "two.bin"
    np.arange(33, dtype=np.uint16).tofile(two)
    document = job(two, validation={"fraction": 0.5}).model_dump(mode="json")
    assert service.request("POST", "/v1/jobs", json=document).status_code == 202
