"""The GPU truth table (benchmarks/gpu_truth.py, run by scripts/gpu_check.sh) runs through on
CPU ranks: every row trains, is measured and, for raytrain's loop, has the prediction a job's
status would show. On a GPU machine the same code runs with --device cuda."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_truth


def test_the_truth_table_measures_its_rows_and_profiles_the_compiled_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dry run of a compiled raytrain row (profiled) and the reference loop: the two
    workers and the profile (all the code a GPU run takes; the other rows differ only in
    their settings)."""
    out = tmp_path / "truth.json"
    gpu_truth.main(["--device", "cpu", "--models", "tiny-llama", "--steps", "7", "--rows",
                    "raytrain bf16 compiled", "torchtitan-style bf16 eager", "--json", str(out)])
    printed = capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["machine"]["torch"].startswith("2.")
    [result] = written["results"]
    assert result["kind"] == "cpu" and result["ranks"] == 1
    rows = {row["setting"]: row for row in result["rows"]}
    assert set(rows) == {"raytrain bf16 compiled", "torchtitan-style bf16 eager"}
    for row in rows.values():
        assert "error" not in row, row
        assert row["step_s"] > 0 and row["tokens_per_s"] > 0 and row["peak_gib"] > 0
        assert 0 <= row["data_s"] < row["step_s"] and row["first_step_s"] > 0
    assert rows["raytrain bf16 compiled"]["layout"] == "1 device mb2x1"
    assert "| raytrain bf16 compiled | 1 device mb2x1 |" in printed
    assert "top kernels, raytrain bf16 compiled, tiny-llama" in printed
    assert "aten::mm" in result["profile"]


@pytest.mark.parametrize("kind", ["h100-sxm", "h200"])
@pytest.mark.parametrize("model", ["gpt-1.4b", "llama-3b"])
def test_every_gpu_row_is_planned_and_fits_its_gpu(kind: str, model: str) -> None:
    """The rows a GPU run takes have the planner's step and memory beside them, and fit the
    GPU by its count (a row that does not fit would waste a lending)."""
    from raytrain.catalog.hardware import GPUS
    from raytrain.core.resolve import plan_summary
    from raytrain.spec import parse_job_spec

    labels = [label for label, *_ in gpu_truth.settings(kind, eager_reference=True)]
    assert "raytrain fp8 compiled" in labels and "torchtitan-style bf16 compiled" in labels
    assert "raytrain fp8 compiled" not in [
        label for label, *_ in gpu_truth.settings("a100-80gb-sxm", eager_reference=False)]
    for _, precision, compiled, _ in gpu_truth.settings(kind, eager_reference=False):
        spec = parse_job_spec(gpu_truth.job_document(model, 1, 12, "cuda", kind, precision,
                                                     compiled))
        summary = plan_summary(spec)
        assert summary.predicted_step_s is not None and summary.predicted_step_s > 0
        assert summary.predicted_memory_gib is not None
        assert summary.predicted_memory_gib < GPUS[kind].memory_bytes / 2**30 * 0.9


def test_gpu_names_map_to_the_catalogs_kinds() -> None:
    assert gpu_truth.catalog_kind("NVIDIA H200") == "h200"
    assert gpu_truth.catalog_kind("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert gpu_truth.catalog_kind("NVIDIA H100 PCIe") == "h100-pcie"
    assert gpu_truth.catalog_kind("NVIDIA A100-SXM4-40GB") == "a100-40gb-sxm"
    assert gpu_truth.catalog_kind("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert gpu_truth.catalog_kind("Some Future GPU") is None
