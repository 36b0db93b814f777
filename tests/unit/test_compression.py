"""Gradient compression through DDP hooks trains close to uncompressed DDP; top-k needs its
error feedback. Two gloo processes, no Ray."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_parallel import _losses, _spawn

STEPS = 150
COMPRESSIONS = {
    "none": {},
    "fp16": {"compression": "fp16"},
    "bf16": {"compression": "bf16"},
    "powersgd": {"compression": "powersgd", "powersgd_rank": 4},
    "topk": {"compression": "topk", "topk_ratio": 0.01},
    "topk_without_error_feedback": {"compression": "topk", "topk_ratio": 0.01,
                                    "topk_error_feedback": False},
}
# How far each may end from uncompressed DDP, as a fraction of its loss (mean of the last 10
# steps). Measured on this workload: fp16 and bf16 within 0.1%, PowerSGD rank 4 +4.8%, top-k
# 1% with error feedback -0.5%, and without it +6.1%.
TOLERANCE = {"fp16": 0.01, "bf16": 0.01, "powersgd": 0.08, "topk": 0.03}


def job(parallel: dict) -> dict:
    return {
        "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                          "max_seq_len": 16}},
        "data": {"seq_len": 16},
        "training": {"steps": STEPS, "global_batch_size": 8, "micro_batch_size": 4,
                     "checkpoint_every_steps": STEPS, "learning_rate": 0.01},
        "parallel": {"strategy": "data", **parallel},
        "resources": {"num_workers": 2},
    }


@pytest.fixture(scope="module")
def final_losses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    out = tmp_path_factory.mktemp("compression")
    _spawn(2, [(name, job(parallel), {}) for name, parallel in COMPRESSIONS.items()], out)
    finals = {}
    for name in COMPRESSIONS:
        losses = _losses(out / name / "losses.json")
        finals[name] = sum(losses[step] for step in range(STEPS - 9, STEPS + 1)) / 10
    (out / "finals.json").write_text(json.dumps(finals))
    return finals


@pytest.mark.parametrize("name", list(TOLERANCE))
def test_compressed_training_ends_near_uncompressed(name: str, final_losses: dict) -> None:
    baseline = final_losses["none"]
    assert final_losses[name] == pytest.approx(baseline, rel=TOLERANCE[name]), final_losses


def test_topk_converges_with_error_feedback_and_lags_without(final_losses: dict) -> None:
    baseline = final_losses["none"]
    with_feedback = final_losses["topk"] - baseline
    without = final_losses["topk_without_error_feedback"] - baseline
    assert without > 0.03 * baseline and without > 2 * max(with_feedback, 0.0), final_losses
