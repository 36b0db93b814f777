"""`raytrain calibrate`'s solve (raytrain.core.calibration) and the profile's file: figures
that produced step times are recovered from them, a stored profile is what the planner
then uses, and a bad file is refused with the fix."""

from __future__ import annotations

import json

import pytest

from raytrain.catalog import hardware
from raytrain.core.calibration import (
    _predict,
    _with,
    reference_jobs,
    solve_profile,
    steady_step_s,
)
from raytrain.core.resolve import job_layout, predicted
from raytrain.errors import SpecError
from raytrain.spec import parse_job_spec
from raytrain.spec.files import PROFILE_FILE, load_cpu_profile, save_cpu_profile

SPECS = [parse_job_spec(job) for job in reference_jobs(steps=20)]


@pytest.mark.parametrize("rate,block,step", [(30e9, 2e-3, 8e-3), (90e9, 0.5e-3, 0.0),
                                             (10e9, 0.0, 20e-3)])
def test_the_figures_behind_measured_steps_are_recovered(rate, block, step) -> None:
    truth = _with(hardware.GPUS["cpu"], rate, block, step)
    measured = [(spec, _predict(spec, truth)) for spec in SPECS]
    profile = solve_profile(measured)
    assert profile.figures["fp32_flops"] == pytest.approx(rate, rel=1e-6)
    assert profile.figures["block_overhead_s"] == pytest.approx(block, abs=1e-9)
    assert profile.figures["step_overhead_s"] == pytest.approx(step, abs=1e-9)
    assert profile.predicted_s == pytest.approx([s for _, s in measured], rel=1e-6)


def test_a_cost_the_steps_do_not_show_is_zero_not_negative() -> None:
    truth = _with(hardware.GPUS["cpu"], 50e9, 1e-3, 0.0)
    # The one-micro-batch job ran faster than any step cost allows.
    measured = [(spec, _predict(spec, truth) * (0.9 if i == 2 else 1.0))
                for i, spec in enumerate(SPECS)]
    figures = solve_profile(measured).figures
    assert min(figures.values()) >= 0


def test_steps_faster_than_the_communication_alone_are_refused() -> None:
    with pytest.raises(ValueError, match="no FLOP/s explains them"):
        solve_profile([(spec, 1e-9) for spec in SPECS])


def test_a_stored_profile_is_what_the_planner_uses(tmp_path) -> None:
    """A stored profile is a new catalog value, what the service and `raytrain plan` pass
    to the planner; the shipped catalog stays as it is (and cannot be changed)."""
    spec = SPECS[1]
    shipped = hardware.GPUS["cpu"]
    before = predicted(spec, job_layout(spec)).step_s
    figures = {"fp32_flops": 20e9, "block_overhead_s": 3e-3, "step_overhead_s": 5e-3}
    save_cpu_profile(tmp_path, figures, {"jobs": []})
    calibrated = load_cpu_profile(tmp_path)
    assert calibrated.gpus["cpu"].step_overhead_s == 5e-3
    assert "raytrain calibrate" in calibrated.gpus["cpu"].calibration
    after = predicted(spec, job_layout(spec), calibrated).step_s
    assert after == pytest.approx(_predict(spec, _with(shipped, 20e9, 3e-3, 5e-3)))
    assert after > before
    assert hardware.GPUS["cpu"] is shipped and predicted(spec, job_layout(spec)).step_s == before
    with pytest.raises(TypeError):
        hardware.GPUS["cpu"] = calibrated.gpus["cpu"]  # type: ignore[index]


def test_no_profile_leaves_the_catalog_and_a_bad_one_names_the_fix(tmp_path):
    assert load_cpu_profile(tmp_path) is hardware.CATALOG
    (tmp_path / PROFILE_FILE).write_text(json.dumps({"figures": {"fp32_flops": -1}}))
    with pytest.raises(SpecError, match="raytrain calibrate"):
        load_cpu_profile(tmp_path)
    (tmp_path / PROFILE_FILE).write_text(json.dumps({"figures": {"warp_speed": 9}}))
    with pytest.raises(SpecError, match="warp_speed"):
        load_cpu_profile(tmp_path)


def test_raytrain_plan_predicts_cpu_jobs_with_the_stored_profile(tmp_path, capsys) -> None:
    from raytrain.cli import main

    job = tmp_path / "job.json"
    job.write_text(json.dumps(reference_jobs(steps=20)[1]))
    argv = ["plan", str(job), "--layout", "dp_replicate=2", "--json", "--state-dir",
            str(tmp_path)]
    assert main(argv) == 0
    [catalog_row] = json.loads(capsys.readouterr().out)["plans"]
    (tmp_path / PROFILE_FILE).write_text(json.dumps({"figures": {
        "fp32_flops": 1e9, "block_overhead_s": 0.01, "step_overhead_s": 0.1}}))
    assert main(argv) == 0
    [calibrated_row] = json.loads(capsys.readouterr().out)["plans"]
    assert calibrated_row["step_s"] > catalog_row["step_s"] + 0.1


def test_a_jobs_step_time_leaves_out_its_first_report_and_reports_without_one() -> None:
    reports = [{"step_s": 9.0}, {"tokens_per_s": 5.0}, {"step_s": 1.0}, {"step_s": 3.0},
               {"step_s": 2.0}]
    assert steady_step_s(reports) == 2.0  # not 2.5 with the warm-up's 9.0
    assert steady_step_s(reports[:2]) is None
