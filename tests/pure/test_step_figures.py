"""What a step's report says besides the loss: the wait for data and compilation's warm-up
reported apart from the step time, and the model FLOPs utilisation of the throughput."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from raytrain.catalog.hardware import CATALOG
from raytrain.core.resolve import measured_mfu, planner_inputs
from raytrain.spec import JobSpec
from raytrain.testing.jobs import gpt_1b_job
from raytrain.testing.runs import run_single, small_spec
from raytrain.train.progress import ProgressMeter
from tests.support.service import Service, small_job


def test_warm_up_and_data_waits_are_reported_apart_from_the_step_time() -> None:
    """Four steps in 10 s, of which 4 s compiling (the first step) and 0.4 s waiting for
    data: the step time is the rest over the steps, the data time a step is reported, and
    the warm-up is left out of tokens/s (so of the ETA). Without the exclusions step_s is
    2.5 s and tokens/s 40 (the test fails)."""
    now = [0.0]
    meter = ProgressMeter(100, tokens_per_step=100, start_step=0, clock=lambda: now[0],
                          interval_s=0.0)
    meter.warmed_up(4.0)
    for step in range(1, 5):
        meter.waited_for_data(0.1)
    now[0] = 10.0
    assert meter.record(4, 1.0)
    shown = meter.snapshot()
    assert shown["step_s"] == pytest.approx((10.0 - 4.0 - 0.4) / 4)
    assert shown["data_s"] == pytest.approx(0.1)
    assert shown["tokens_per_s"] == pytest.approx(400 / 6.0)
    assert shown["warmup_s"] == 4.0


def test_mfu_is_the_planners_flops_over_the_devices_peak() -> None:
    spec = JobSpec.model_validate(gpt_1b_job("h100-sxm"))
    dims, work, _, _ = planner_inputs(spec)
    peak = CATALOG.node_shape("h100-sxm").gpu.flops("bf16")
    mfu = measured_mfu(spec, 50_000.0, 8, "h100-sxm")
    assert mfu == pytest.approx(50_000.0 * dims.flops_per_token / (8 * peak))
    assert 0.0 < mfu < 1.0
    assert measured_mfu(spec, 50_000.0, 8, "no-such-gpu") is None


def test_a_jobs_status_and_metrics_carry_its_mfu(tmp_path: Path) -> None:
    """Rank 0 reports tokens/s; the service adds the MFU to the status and /metrics."""
    service = Service(tmp_path)
    job_id = service.request("POST", "/v1/jobs", json=small_job()).json()["id"]
    service.tick()
    service.train(job_id, 3)
    progress = service.request("GET", f"/v1/jobs/{job_id}").json()["progress"]
    assert progress["mfu"] is not None and progress["mfu"] > 0
    metrics = service.request("GET", "/metrics").text
    assert f'raytrain_job_mfu{{job="{job_id}"' in metrics


@pytest.mark.timeout(600)
def test_a_compiled_run_matches_eager_and_reports_its_warm_up(tmp_path: Path) -> None:
    """training.compile on CPU (inductor): each block compiled in place, the same losses as
    eager to fp32 rounding (1e-4: fused kernels reorder sums), and the first step's compiling
    reported as warmup_s, not as step time."""
    from raytrain.core.resolve import job_layout
    from raytrain.parallel.parallelize import build_parallel_model

    spec = small_spec(1, steps=6, compile=True)
    built = build_parallel_model(spec, job_layout(spec), torch.device("cpu"))
    blocks = list(built.parts[0].layers.values())
    # Module.compile() keeps the module and sets its compiled call (torch has no public flag)
    assert built.compiled and all(getattr(b, "_compiled_call_impl", None) is not None
                                  for b in blocks)
    eager = run_single(small_spec(1, steps=6), tmp_path / "eager")
    compiled = run_single(small_spec(1, steps=6, compile=True), tmp_path / "compiled")
    for step, loss in eager.losses().items():
        # Inductor fuses and reorders the block's sums (its own CPU kernels): more ulps than
        # two eager orders, compounding over 6 steps; a wrong graph moves losses by over 1e-2.
        assert compiled.losses()[step] == pytest.approx(loss, abs=1e-4), step
    assert compiled.reports[-1].get("warmup_s", 0) > 0
    assert "warmup_s" not in eager.reports[-1]
