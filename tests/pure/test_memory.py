"""The planner's memory, checked against what runs: the tensors a block saves, the order
torch's interleaved schedule runs in, and the published runs that ran."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

from benchmarks.published_runs import published_runs
from raytrain.core.in_flight import interleaved_peak, layers_in_flight
from raytrain.core.planner import ModelDims, evaluate
from raytrain.errors import SpecError
from raytrain.models.gpt import GPT
from raytrain.spec import GPTConfig
from raytrain.spec.layout import Layout, stage_layers


def _saved_bytes(block: torch.nn.Module, x: torch.Tensor, params: set[int]) -> int:
    """Bytes of the distinct storages autograd saves for the block's backward, weights aside."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    return sum(seen.values())


@pytest.mark.parametrize("mlp,positions,kv_heads", [("gelu", "learned", None),
                                                     ("swiglu", "rotary", 2)])
def test_the_values_a_block_saves_are_those_the_planner_counts(mlp, positions, kv_heads):
    """Measured with saved-tensor hooks on raytrain's own block (eager, fp32): the growth per
    token between two batch sizes (so fixed-size tensors drop out) is the planner's count to
    within the per-token scalars (the norms' inverse RMS, the attention's log-sum-exp). The
    SwiGLU's four hidden tensors are what a count of three (as once) fails on."""
    d, ffn, seq = 256, 512, 128
    config = GPTConfig(vocab_size=64, dim=d, num_layers=1, num_heads=8, num_kv_heads=kv_heads,
                       ffn_dim=ffn, max_seq_len=seq, mlp=mlp, positions=positions)
    model = GPT(config)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    block = model.layers["0"]
    small, large = (_saved_bytes(block, torch.randn(b, seq, d, requires_grad=True), params)
                    for b in (2, 6))
    per_token = (large - small) / 4 / (4 * seq)  # fp32 values
    dims = ModelDims.from_gpt(1, d, 8, ffn, 64, seq, seq, num_kv_heads=kv_heads,
                              gated_mlp=mlp == "swiglu", rotary=positions == "rotary")
    assert 0 <= per_token - dims.saved_values_per_token_layer(fused=False) <= 16


def _torch_peak(pp: int, m: int, rank: int, layers: tuple[int, ...]) -> int:
    """The most layer-micro-batches rank `rank` holds, walking the schedule torch builds."""
    v = len(layers)
    stages = [SimpleNamespace(num_stages=pp * v, group_size=pp, group_rank=rank,
                              stage_index=rank + i * pp, is_last=False) for i in range(v)]
    held = peak = 0
    for action in ScheduleInterleaved1F1B(stages, m).pipeline_order[rank]:
        if action is None:
            continue
        if action.computation_type == _ComputationType.FORWARD:
            held += layers[action.stage_index // pp]
            peak = max(peak, held)
        elif action.computation_type == _ComputationType.FULL_BACKWARD:
            held -= layers[action.stage_index // pp]
    return peak


@pytest.mark.parametrize("pp,v,m", [(4, 2, 8), (4, 3, 12), (8, 2, 24), (16, 8, 16),
                                    (16, 8, 32)])
def test_the_interleaved_peak_is_that_of_torchs_own_schedule(pp, v, m):
    """raytrain.core.in_flight walks ScheduleInterleaved1F1B's order from plain values; torch's
    own schedule, built from stand-in stages, must give the same peak on every rank, stages
    of unequal (and no) layers included."""
    for rank in range(pp):
        layers = tuple((rank + i) % 3 for i in range(v))
        assert interleaved_peak(pp, m, rank, layers) == _torch_peak(pp, m, rank, layers)


def test_the_stages_a_layer_short_are_the_ends():
    """The first stage also holds the embeddings, the last the head and the loss (Llama 3's
    split: 126 layers on 128 stages leaves the first and the last with none)."""
    assert [len(r) for r in stage_layers(10, 4)] == [2, 3, 3, 2]
    assert [len(r) for r in stage_layers(9, 4)] == [2, 2, 3, 2]
    assert [len(r) for r in stage_layers(8, 4)] == [2, 2, 2, 2]
    llama = [len(r) for r in stage_layers(126, 128)]
    assert llama[0] == llama[-1] == 0 and set(llama[1:-1]) == {1}
    # Every layer once, in order.
    assert [i for r in stage_layers(126, 128) for i in r] == list(range(126))
    # So the first rank of an interleaved pipeline holds less than the second.
    c = Layout(pp=16, virtual_stages=8, microbatches=32, schedule="interleaved_1f1b")
    assert layers_in_flight(126, c, 0) < layers_in_flight(126, c, 1)


def test_no_published_run_is_reported_as_not_fitting():
    """Each run of benchmarks/published_runs.yaml ran, at its own layout on its own devices:
    none may be over its device's memory. Llama 3 405B on 8,192 H100s is the one over the
    usable 92%: tight, as a run tuned to its last GiB is (its paper profiles memory to fit)."""
    verdicts = {}
    for run in published_runs():
        p = evaluate(run.dims, run.work, run.layout, run.shape)
        verdicts[run.name] = "fits" if p.fits else "tight" if p.tight else "over"
    assert "over" not in verdicts.values(), verdicts
    assert verdicts["Llama 3 405B, 8192 H100, TP 8 x PP 16 x DP 64"] == "tight"


def test_raytrain_plan_says_tight_not_does_not_fit_within_the_device(tmp_path, capsys):
    """Llama 3 8B on 8 H100s, three sequences of 8,192 per micro-batch, selective
    recomputation: 75.3 GiB, over the 73.3 usable and under the device's 79.6. Four of 7,168
    are over the device (83.8 GiB): that one does not fit."""
    from raytrain.cli import main

    def plan(micro: int, seq_len: int) -> tuple[dict, str]:
        argv = ["plan", "--model-config", "examples/llama-3-8b-config.json", "--gpus", "8",
                "--gpu", "h100-sxm", "--layout", f"dp_shard=8,micro_batch_size={micro},"
                "recompute=selective", "--seq-len", str(seq_len), "--global-batch",
                str(8 * micro), "--state-dir", str(tmp_path)]
        assert main([*argv, "--json"]) == 0
        [row] = json.loads(capsys.readouterr().out)["plans"]
        assert main(argv) == 0
        return row, capsys.readouterr().err

    row, said = plan(3, 8192)
    assert not row["fits"] and row["tight"] and "fits only tightly" in said
    row, said = plan(4, 7168)
    assert not row["fits"] and not row["tight"] and "does not fit" in said


def test_a_model_config_is_planned_at_the_layout_asked_for_not_data_parallels(tmp_path, capsys):
    """Without a spec file, --model-config's job is the planner's to lay out: a global batch
    that data parallelism over every GPU could not split (12 over 8) is fine for the layout
    asked for (4 FSDP ranks x 2 stages: 3 micro-batches each). It was refused, as if the job
    were data parallel."""
    from raytrain.cli import main

    argv = ["plan", "--model-config", "examples/llama-3-8b-config.json", "--gpus", "8",
            "--gpu", "h100-sxm", "--layout", "dp_shard=4,pp=2", "--global-batch", "12",
            "--state-dir", str(tmp_path), "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    [row] = json.loads(capsys.readouterr().out)["plans"]
    layout = row["layout"]
    assert (layout["dp_shard"], layout["pp"], layout["microbatches"]) == (4, 2, 3)


def test_a_pipeline_may_end_in_stages_of_only_the_embeddings_and_the_head():
    """Llama 3's split: with two stages more than layers, the first holds only the embeddings
    and the last only the head (tests/ranks/test_parallel.py trains 4 layers on 6 stages as one
    process does); a third more would leave a middle stage empty, and is refused."""
    from raytrain.spec import parse_job_spec

    def spec(virtual_stages: int):
        return parse_job_spec({
            "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 4, "num_heads": 4,
                              "max_seq_len": 16}},
            "data": {"seq_len": 16},
            "training": {"steps": 2, "global_batch_size": 8, "micro_batch_size": 2},
            "parallel": {"strategy": "pipeline", "pipeline_schedule": "interleaved_1f1b",
                         "virtual_stages": virtual_stages},
            "resources": {"num_workers": 2}})

    spec(3)
    with pytest.raises(SpecError, match="at most 6 stages"):
        spec(4)


def test_the_built_in_models_chunked_loss_is_planned_a_chunk_at_a_time() -> None:
    """A 125M GPT (12 layers, dim 768, vocabulary 50,368) at micro-batch 26 of 2,048 tokens
    trains on an A100-40GB (a published nanoGPT-style run), and plans onto it: raytrain's loss
    holds one chunk's logits, not 53,248 x 50,368 of them (counted whole it is predicted at
    51 GiB: undone once). The planner's chunk is the model's."""
    from dataclasses import replace

    from raytrain.catalog.hardware import node_shape
    from raytrain.core.cost_model import LOSS_CHUNK_BYTES
    from raytrain.core.planner import evaluate
    from raytrain.core.resolve import planner_inputs
    from raytrain.models import gpt
    from raytrain.spec import JobSpec
    from raytrain.spec.layout import Layout

    assert LOSS_CHUNK_BYTES == gpt.LOSS_CHUNK_BYTES
    spec = JobSpec.model_validate({
        "model": {"gpt": {"vocab_size": 50368, "dim": 768, "num_layers": 12, "num_heads": 12,
                          "max_seq_len": 2048}},
        "data": {"seq_len": 2048},
        "training": {"global_batch_size": 26, "micro_batch_size": 26, "precision": "bf16"},
        "resources": {"num_workers": 1, "gpus_per_worker": 1, "accelerator": "a100-40gb-sxm"}})
    dims, work, kind, _ = planner_inputs(spec)
    one = Layout(micro_batch_size=26, microbatches=1)
    planned = evaluate(dims, work, one, node_shape(kind))
    whole = evaluate(dims, replace(work, chunked_loss=False), one, node_shape(kind))
    assert planned.fits and planned.memory_bytes < 0.6 * whole.memory_bytes
    assert not whole.fits
