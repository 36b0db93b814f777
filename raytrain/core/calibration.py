"""This machine's CPU profile from jobs the service ran (`raytrain calibrate`): the FLOP/s of one
rank, its fixed cost per block per micro-batch and its fixed cost per optimizer step, solved
from the measured step times of three reference jobs.

For a given job the planner's predicted step time is linear in those three figures (1/rate,
block cost, step cost) with everything else held: the solve reads each job's coefficients
off the planner itself, at unit values, and solves the jobs' equations by least squares. So
what the service adds around a rank's work (Ray Train's workers, the service's own processes
on the same cores, the loop's reports) lands in the figures the planner then uses, and the
profile cannot drift from the model it feeds. numpy's least squares; no other library fits a
model it does not know.

    jobs = reference_jobs()                              # three job documents
    profile = solve_profile([(parse_job_spec(j), measured_s) for j, measured_s in ...])
    profile.figures  # {"fp32_flops": ..., "block_overhead_s": ..., "step_overhead_s": ...}
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from raytrain.catalog.hardware import CATALOG, GPUKind
from raytrain.core.planner import evaluate
from raytrain.core.resolve import job_layout, planner_inputs
from raytrain.spec import JobSpec

# Three jobs whose step times separate the three figures: a wide model (its matmuls set the
# rate), and a tiny one with four micro-batches and with one (the block cost per micro-batch
# against the cost per step). Two workers, a core each, data parallel: as the demo runs.
WIDE = {"vocab_size": 8192, "dim": 512, "num_layers": 4, "num_heads": 8, "max_seq_len": 64}
TINY = {"vocab_size": 64, "dim": 64, "num_layers": 4, "num_heads": 4, "max_seq_len": 16}


def _job(name: str, model: dict[str, int], micro_batch: int, steps: int) -> dict[str, Any]:
    return {
        "name": f"calibrate-{name}",
        "model": {"kind": "gpt", "gpt": model},
        "data": {"kind": "synthetic", "seq_len": model["max_seq_len"]},
        "training": {"steps": steps, "global_batch_size": 16, "micro_batch_size": micro_batch,
                     "checkpoint_every_steps": 100_000},
        "parallel": {"strategy": "data"},
        "resources": {"num_workers": 2, "cpus_per_worker": 1},
    }


def reference_jobs(steps: int = 300) -> list[dict[str, Any]]:
    """The three jobs `raytrain calibrate` runs (the wide one a fifteenth of `steps`: its steps
    are slower)."""
    return [_job("wide", WIDE, 2, max(10, steps // 15)), _job("tiny-4mb", TINY, 2, steps),
            _job("tiny-1mb", TINY, 8, steps)]


def steady_step_s(progress: Sequence[dict[str, Any]]) -> float | None:
    """A job's step time as its status and calibration read it: the median of its progress
    reports' `step_s` (checkpoint saves left out) after the first, which carries the warm-up;
    None with fewer than two."""
    steps = [report["step_s"] for report in progress if report.get("step_s")]
    return statistics.median(steps[1:]) if len(steps) > 1 else None


@dataclass(frozen=True)
class Profile:
    figures: dict[str, float]  # hardware.CPU_PROFILE_FIELDS
    predicted_s: list[float]  # each job's step with the new figures
    before_s: list[float]  # and with the catalog's


def _predict(spec: JobSpec, gpu: GPUKind) -> float:
    dims, work, _, _ = planner_inputs(spec)
    shape = CATALOG.cpu_share(replace(CATALOG.shapes["cpu-local"], gpu=gpu),
                              spec.resources.cpus_per_worker)
    return evaluate(dims, work, job_layout(spec), shape).step_s


def _with(base: GPUKind, rate: float, block: float, step: float) -> GPUKind:
    return replace(base, fp32_flops=rate, bf16_flops=rate, achievable=1.0,
                   block_overhead_s=block, step_overhead_s=step)


def solve_profile(measured: Sequence[tuple[JobSpec, float]],
                  base: GPUKind | None = None) -> Profile:
    """The rate, block cost and step cost that best explain `measured` (job, seconds per
    step) under the planner's model of `base` (default: the catalog's CPU), none negative.
    ValueError when the jobs cannot separate them or a figure comes out impossible."""
    base = base or CATALOG.gpus["cpu"]
    if len(measured) < 3:
        raise ValueError("three jobs or more are needed to separate three figures")
    rows, targets = [], []
    for spec, seconds in measured:
        fixed = _predict(spec, _with(base, 1e30, 0.0, 0.0))
        per_inverse_rate = _predict(spec, _with(base, 1.0, 0.0, 0.0)) - fixed
        per_block = _predict(spec, _with(base, 1e30, 1.0, 0.0)) - fixed
        per_step = _predict(spec, _with(base, 1e30, 0.0, 1.0)) - fixed
        rows.append([per_inverse_rate, per_block, per_step])
        targets.append(seconds - fixed)
    a, b = np.array(rows), np.array(targets)
    free = [0, 1, 2]
    while True:  # least squares, dropping a cost that comes out negative (it is then 0)
        x = np.zeros(3)
        x[free] = np.linalg.lstsq(a[:, free], b, rcond=None)[0]
        negative = [i for i in free if i > 0 and x[i] < 0]
        if not negative:
            break
        free.remove(negative[0])
    if x[0] <= 0:
        raise ValueError("the measured steps are faster than the planner's communication "
                         "and memory traffic alone: no FLOP/s explains them")
    figures = {"fp32_flops": float(1 / x[0]), "block_overhead_s": float(x[1]),
               "step_overhead_s": float(x[2])}
    fitted = _with(base, figures["fp32_flops"], x[1], x[2])
    return Profile(figures, [_predict(spec, fitted) for spec, _ in measured],
                   [_predict(spec, base) for spec, _ in measured])
