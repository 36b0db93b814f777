"""The validation loss is the same under every layout: 2 gloo ranks under data, FSDP,
tensor parallelism and pipelines (1F1B and interleaved: the schedule's forward-only pass)
measure, at each eval step, one process's validation loss to 1e-5 (the
held-out windows cut across data-parallel ranks as a training step's are, the losses
averaged over them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raytrain.spec import JobSpec
from raytrain.testing.parity import _spawn
from raytrain.testing.runs import run_single
from tests.support.tolerances import SUM_ORDER

LAYOUTS = {"dp2": {"strategy": "data"}, "fsdp2": {"strategy": "fsdp"},
           "tp2": {"strategy": "tensor"}, "pp2_1f1b": {"strategy": "pipeline"},
           "pp2_interleaved": {"strategy": "pipeline", "pipeline_schedule": "interleaved_1f1b",
                               "virtual_stages": 2}}


def document(path: Path, workers: int, parallel: dict[str, str] | None = None) -> dict:
    return {"model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                              "max_seq_len": 16}},
            "data": {"kind": "token_file", "path": str(path), "seq_len": 16, "shuffle": True,
                     "validation": {"fraction": 0.25}},
            "training": {"steps": 6, "global_batch_size": 8, "micro_batch_size": 2,
                         "checkpoint_every_steps": 3, "eval_batches": 2,
                         "learning_rate": 0.01},
            "parallel": parallel or {}, "resources": {"num_workers": workers}}


def test_every_layout_measures_one_process_validation_loss(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 64, size=16 * 40 + 1).astype(np.uint16).tofile(path)
    single = run_single(JobSpec.model_validate(document(path, 1)), tmp_path / "single")
    expected = {r["val_step"]: r["val_loss"] for r in single.reports if "val_loss" in r}
    assert sorted(expected) == [3, 6]
    _spawn(2, [(name, document(path, 2, parallel), {}) for name, parallel in LAYOUTS.items()],
           tmp_path / "runs")
    import json

    for name in LAYOUTS:
        got = json.loads((tmp_path / "runs" / name / "val.json").read_text())
        assert {int(k): v for k, v in got.items()} == pytest.approx(expected, abs=SUM_ORDER), name
