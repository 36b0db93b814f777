"""The GPU truth table (benchmarks/gpu_truth.py, run by scripts/gpu_check.sh) runs through on
CPU ranks: every row trains, is measured and, for raytrain's loop, has the prediction a job's
status would show. On a GPU machine the same code runs with --device cuda."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_truth


def test_the_truth_table_measures_every_row_beside_its_prediction(
        capsys: pytest.CaptureFixture[str]) -> None:
    gpu_truth.main(["--device", "cpu", "--size", "tiny", "--steps", "6", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert result["kind"] == "cpu" and result["ranks"] == 1
    rows = {row["setting"]: row for row in result["rows"]}
    assert set(rows) == {"raytrain loop, bf16", "raytrain loop, fp32",
                         "torchtitan-style loop, bf16, FSDP2"}
    for row in rows.values():
        assert row["step_s"] > 0 and row["tokens_per_s"] > 0 and row["peak_gib"] > 0
    for setting in ("raytrain loop, bf16", "raytrain loop, fp32"):
        assert rows[setting]["predicted_step_s"] > 0
        assert rows[setting]["predicted_memory_gib"] > 0
    assert "| raytrain loop, fp32 |" in gpu_truth.table(result)


def test_gpu_names_map_to_the_catalogs_kinds() -> None:
    assert gpu_truth.catalog_kind("NVIDIA H200") == "h200"
    assert gpu_truth.catalog_kind("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert gpu_truth.catalog_kind("NVIDIA H100 PCIe") == "h100-pcie"
    assert gpu_truth.catalog_kind("NVIDIA A100-SXM4-40GB") == "a100-40gb-sxm"
    assert gpu_truth.catalog_kind("NVIDIA GeForce RTX 4090") == "rtx4090"
    assert gpu_truth.catalog_kind("Some Future GPU") is None
