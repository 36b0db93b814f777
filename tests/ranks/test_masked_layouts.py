"""Fine-tuning data with masks (`data prepare --chat`): a step's loss is the mean over its
trained targets, every rank's, however the step is cut. The reference is one process taking
the step as one micro-batch; its first loss is a plain masked mean of the untrained model
over the step's batch (the mean of each micro-batch's mean, which the layouts below would
give with two micro-batches, differs from it), and every layout with two micro-batches a
step (data, FSDP, tensor, a 1F1B pipeline) matches it to 1e-5 every step, its validation
loss too. Breaking the scale (each micro-batch's masked mean instead) fails it (checked)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raytrain.core.shuffle import held_out_windows
from raytrain.data.prepare import prepare
from raytrain.data.shards import TokenShards
from raytrain.models.registry import build_model
from raytrain.spec import JobSpec
from raytrain.testing.parity import _losses, _spawn
from raytrain.testing.runs import run_single
from tests.support.corpus import CHATML, chat_inputs
from tests.support.tolerances import SUM_ORDER

SEQ, STEPS, G = 16, 6, 8
MODEL = {"gpt": {"vocab_size": 320, "dim": 32, "num_layers": 4, "num_heads": 4,
                 "max_seq_len": SEQ}}
LAYOUTS = {"dp2": {"strategy": "data"}, "fsdp2": {"strategy": "fsdp"},
           "tp2": {"strategy": "tensor"}, "pp2_1f1b": {"strategy": "pipeline"}}


def document(path: Path, workers: int, micro: int, parallel: dict | None = None,
             validation: bool = True) -> dict:
    return {"model": MODEL,
            "data": {"kind": "token_file", "path": str(path), "seq_len": SEQ, "shuffle": True,
                     **({"validation": {"fraction": 0.2}} if validation else {})},
            "training": {"steps": STEPS, "global_batch_size": G, "micro_batch_size": micro,
                         "checkpoint_every_steps": 3, "eval_batches": 2,
                         "learning_rate": 0.01},
            "parallel": parallel or {}, "resources": {"num_workers": workers}}


def test_masked_loss_is_the_steps_mean_over_trained_targets_at_every_layout(
        tmp_path: Path) -> None:
    tokenizer, files = chat_inputs(tmp_path, CHATML)
    shards = tmp_path / "shards"
    prepare(files, str(tokenizer), str(shards), shard_tokens=400, chat=True)

    one = JobSpec.model_validate(document(shards, 1, G))
    single = run_single(one, tmp_path / "single")
    reference = single.losses()
    val = {r["val_step"]: r["val_loss"] for r in single.reports if "val_loss" in r}
    assert sorted(val) == [3, 6]

    # Step 1's loss: the untrained model's mean cross-entropy over the trained targets of
    # the step's 8 windows (shuffled, 20% held out), by hand.
    source = TokenShards(str(shards), SEQ, None, shuffle=True)
    source.num_windows -= held_out_windows(source.num_windows, 0.2)
    batch = source.batch(range(G))
    inputs = torch.where(batch < 0, -batch - 1, batch)[:, :-1]
    targets = torch.where(batch < 0, -100, batch)[:, 1:]
    model = build_model(one.model, seed=one.training.seed)
    with torch.no_grad():
        logits = model(inputs)
    by_hand = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    halves = [F.cross_entropy(logits[h].flatten(0, 1).float(), targets[h].flatten())
              for h in (slice(0, G // 2), slice(G // 2, G))]
    assert 0 < int((targets >= 0).sum()) < targets.numel()
    assert reference[1] == pytest.approx(float(by_hand), abs=SUM_ORDER)
    assert abs(float(sum(halves)) / 2 - float(by_hand)) > 1e-3  # the cut would show

    cases = [(name, document(shards, 2, 4 if name == "tp2" else 2, parallel), {})
             for name, parallel in LAYOUTS.items()]
    _spawn(2, cases, tmp_path / "runs")
    for name, _, _ in cases:
        got = _losses(tmp_path / "runs" / name / "losses.json")
        assert sorted(got) == list(range(1, STEPS + 1))
        for step in reference:
            assert got[step] == pytest.approx(reference[step], abs=SUM_ORDER), (name, step)
        measured = json.loads((tmp_path / "runs" / name / "val.json").read_text())
        assert {int(k): v for k, v in measured.items()} == pytest.approx(val, abs=SUM_ORDER), name


def test_a_masked_steps_tokens_are_its_trained_targets(tmp_path: Path) -> None:
    """tokens/s and the history's tokens count the targets trained, not every token."""
    tokenizer, files = chat_inputs(tmp_path, None)
    shards = tmp_path / "shards"
    prepare(files, str(tokenizer), str(shards), chat=True)
    spec = JobSpec.model_validate(document(shards, 1, 2, validation=False))
    sink = run_single(spec, tmp_path / "run")
    source = TokenShards(str(shards), SEQ, None, shuffle=True)
    rows = sink.step_rows()
    counted = {step: row[4] for step, row in rows.items()}
    expected = {s + 1: source.trained(range(s * G, (s + 1) * G)) for s in range(STEPS)}
    assert counted == expected and all(0 < n < G * SEQ for n in expected.values())
    assert np.isfinite(sink.reports[-1]["tokens_per_s"])
