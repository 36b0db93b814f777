"""docs/reference/step.md, "What a step does", reproduced by a plain PyTorch loop written from that
section alone: a job's reported losses and its history's learning rates and gradient norms
match it. (Warmup as `s / W`, or weight decay on every parameter, or no clipping: it fails.)"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raytrain.core.resolve import job_layout
from raytrain.spec import JobSpec
from raytrain.testing.jobs import RecordingSink, make_hf_llama
from raytrain.train.loop import train
from raytrain.train.rank import WorkerInfo
from tests.support.tolerances import SUM_ORDER

pytest.importorskip("transformers")

SEED, STEPS, G, M, SEQ, PEAK, W, CLIP, DECAY, MIN_RATIO = 3, 8, 8, 4, 16, 0.01, 3, 0.5, 0.1, 0.1


def _job(token_file: Path) -> JobSpec:
    return JobSpec.model_validate({
        "model": {"kind": "import", "factory": "raytrain.testing.jobs:make_hf_llama"},
        "data": {"kind": "token_file", "path": str(token_file), "dtype": "uint16",
                 "seq_len": SEQ},
        "training": {"steps": STEPS, "global_batch_size": G, "micro_batch_size": M,
                     "learning_rate": PEAK, "warmup_steps": W, "grad_clip_norm": CLIP,
                     "weight_decay": DECAY, "min_lr_ratio": MIN_RATIO, "seed": SEED,
                     "checkpoint_every_steps": 100},
        "resources": {"num_workers": 1},
    })


def _plain_loop(ids: np.ndarray, model: torch.nn.Module | None = None, balance: float = 0.0
                ) -> tuple[list[float], list[float], list[float]]:
    """Each step's loss, learning rate and gradient norm, as docs/reference/step.md says they
    are (the model trained in place); with `balance`, a mixture of experts' objective adds
    transformers' load-balancing loss times it (the loss reported is the model's alone)."""
    torch.manual_seed(SEED)
    model = make_hf_llama() if model is None else model
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": DECAY},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=PEAK, betas=(0.9, 0.95), eps=1e-8, fused=True)
    windows = (len(ids) - 1) // SEQ
    losses, lrs, norms = [], [], []
    for s in range(STEPS):
        if s < W:
            lr = PEAK * (s + 1) / W
        else:
            progress = min(1.0, (s - W) / max(1, STEPS - W))
            lr = PEAK * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr
        micro_batches = G // M
        total = 0.0
        for a in range(micro_batches):
            first = s * G + a * M
            batch = torch.from_numpy(np.stack([
                ids[(i % windows) * SEQ:(i % windows) * SEQ + SEQ + 1].astype(np.int64)
                for i in range(first, first + M)]))
            out = model(batch[:, :-1], output_router_logits=True) if balance \
                else model(batch[:, :-1])
            loss = F.cross_entropy(out.logits.float().flatten(0, 1), batch[:, 1:].flatten())
            objective = loss + balance * out.aux_loss if balance else loss
            (objective / micro_batches).backward()
            total += float(loss) / micro_batches
        norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in params))
        for p in params:
            p.grad.mul_(min(1.0, CLIP / (float(norm) + 1e-6)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
        lrs.append(lr)
        norms.append(float(norm))
    return losses, lrs, norms


def test_a_plain_loop_from_the_readme_reproduces_a_jobs_losses(tmp_path: Path) -> None:
    ids = np.random.default_rng(0).integers(0, 64, size=SEQ * 23 + 5).astype(np.uint16)
    token_file = tmp_path / "tokens.bin"
    ids.tofile(token_file)
    sink = RecordingSink()
    spec = _job(token_file)
    train(spec, WorkerInfo.single_process(), sink, tmp_path / "ckpt", layout=job_layout(spec),
          progress_interval_s=0.0)
    rows = sink.step_rows()
    losses, lrs, norms = _plain_loop(ids)
    assert sorted(rows) == list(range(1, STEPS + 1))
    assert [rows[s + 1][1] for s in range(STEPS)] == pytest.approx(losses, abs=SUM_ORDER)
    assert [rows[s + 1][2] for s in range(STEPS)] == pytest.approx(lrs, rel=1e-12)
    # a norm: a square root of a sum of squares over every parameter, ordered otherwise
    assert [rows[s + 1][3] for s in range(STEPS)] == pytest.approx(norms, rel=1e-4)
    assert max(norms) > CLIP  # clipping took part


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral",
                                    "deepseek_v3", "deepseek_v2"])
def test_a_pretrained_folder_trained_then_exported_is_a_plain_transformers_loops_model(
        tmp_path: Path, family: str) -> None:
    """A kind 'hf' job from a pretrained folder, trained for a few steps, writes `hf/` at its
    end; the same folder trained by the plain loop above in transformers, on the same data,
    has the same losses (1e-5) and, loaded back with `from_pretrained`, the same weights
    (1e-4). A mixture of experts with its family's balancing: transformers' load-balancing
    loss times router_aux_loss_coef in the objective (without it in ours, the weights
    differ: undone once), its balancing loss and imbalance kept beside the loss."""
    import transformers

    from tests.support.hf_models import MOE_FAMILIES, make_folder

    ids = np.random.default_rng(1).integers(0, 64, size=SEQ * 23 + 5).astype(np.uint16)
    token_file = tmp_path / "tokens.bin"
    ids.tofile(token_file)
    folder = make_folder(family, tmp_path / family)
    document = _job(token_file).model_dump(mode="json", exclude_unset=True)
    if family == "deepseek_v3":  # transformers leaves the bias as loaded
        document["training"] = {**document["training"], "moe": {"bias_update_rate": 0.0}}
    spec = JobSpec.model_validate({**document, "model": {"kind": "hf",
                                                         "hf": {"path": str(folder)}}})
    sink = RecordingSink()
    train(spec, WorkerInfo.single_process(), sink, tmp_path / "ckpt", layout=job_layout(spec),
          progress_interval_s=0.0)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder,
                                                               torch_dtype=torch.float32)
    balance = float(getattr(theirs.config, "router_aux_loss_coef", 0.0) or 0.0) \
        if "moe" in family or family == "mixtral" else 0.0
    losses, _, _ = _plain_loop(ids, theirs.train(), balance)
    rows = sink.step_rows()
    assert [rows[s + 1][1] for s in range(STEPS)] == pytest.approx(losses, abs=SUM_ORDER)
    last = sink.reports[-1]
    if family == "deepseek_v3":  # transformers' config counts one, which no folder here holds
        assert "multi-token prediction" in last["left_out"]
    if family in MOE_FAMILIES:  # reported with or without the loss in the objective
        assert last["balance_loss"] > 0 and 1.0 <= last["expert_imbalance"] <= 4.0
    else:
        assert "balance_loss" not in last
    ours = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "hf",
                                                             torch_dtype=torch.float32)
    mine = dict(ours.named_parameters())
    for name, param in theirs.named_parameters():
        assert torch.allclose(mine[name], param, atol=1e-4, rtol=0), name
