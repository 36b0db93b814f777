"""The planner: validated against published large-scale runs, and its model's monotonicity
checked with hypothesis."""

from __future__ import annotations

import json
import statistics
import weakref
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.planner_published import (
    ONE_T,
    errors,
    predicted_per_gpu,
    time_one_trillion,
)
from benchmarks.published_runs import published_runs
from raytrain.catalog.hardware import GPUS, NODE_SHAPES, GiB, GPUKind, node_shape
from raytrain.core.cost_model import loss_bytes_per_logit
from raytrain.core.kernels import KERNELS
from raytrain.core.planner import (
    Layout,
    ModelDims,
    NothingFits,
    Workload,
    candidates,
    evaluate,
    memory_per_device,
    plan,
    step_time,
)
from raytrain.core.resolve import planner_inputs, rank_plans
from raytrain.errors import SpecError
from raytrain.parallel.model import _cross_entropy
from raytrain.spec import JobSpec, LayoutChoice, PlanRequest, spec_error_from_validation
from raytrain.spec.files import snapshot
from raytrain.testing.jobs import gpt_1b_job


def test_predictions_hold_on_published_runs_they_were_not_fitted_to() -> None:
    # Fitted: a few runs (benchmarks/planner_published.py --fit); held out: every other run
    # in benchmarks/published_runs.yaml, at its own layout and on its own machines.
    fitted = [abs(e) for e in errors(KERNELS, "fit")]
    held_out = [abs(e) for e in errors(KERNELS, "validate")]
    assert len(held_out) >= 10 and max(fitted) < 0.05
    # The targets for runs the planner was not fitted to: median within 8%, worst within 20%.
    assert statistics.median(held_out) <= 0.08 and max(held_out) <= 0.20


@pytest.mark.parametrize("run", [r for r in published_runs() if r.memory_gib is not None],
                         ids=lambda r: r.name)
def test_predicted_memory_matches_published_peaks(run) -> None:
    # Published peaks are the allocator's reserved memory; the planner counts live tensors.
    # The 70B run (tensor parallel, compile and Float8) is the nearest the edge, 15.3% under
    # (14.6% before fused kernels were counted as saving 2d and f less per token and layer;
    # tests/pure/test_memory.py measures the eager count): BENCHMARKS.md says what is
    # counted and what is not.
    assert predicted_per_gpu(run)[1] == pytest.approx(run.memory_gib, rel=0.16)


def test_dropping_full_recomputation_is_worth_what_it_was_measured_to_be() -> None:
    """Korthikanti et al., Reducing Activation Recomputation in Large Transformer Models
    (MLSys 2023): the 530B GPT on A100s (TP 8 x PP 35) ran at 54.2% MFU with sequence
    parallelism and selective recomputation against 42.1% with full recomputation, 1.29x;
    their 22B to 1T runs gained 1.29-1.32x. The planner, on the 530B run of
    benchmarks/published_runs.yaml moved from full to selective recomputation (and sequence
    parallelism) and on the other Megatron-LM runs of 8-way tensor parallelism, must predict
    that gain, not the 1.38-1.58x it once did, nor the 1.34x of no recomputation at all (a
    selective recomputation priced as free fails it). Not fitted: no constant saw these pairs."""
    gains = {}
    for run in published_runs():
        if not run.name.startswith("Megatron-LM GPT") or run.layout.tp != 8:
            continue
        full = evaluate(run.dims, run.work, run.layout, run.shape)
        selective = evaluate(run.dims, run.work, replace(
            run.layout, recompute="selective", sequence_parallel=True), run.shape)
        gains[run.name] = selective.tokens_per_s / full.tokens_per_s
    assert len(gains) >= 5
    assert gains["Megatron-LM GPT 530B, 2520 A100"] == pytest.approx(54.2 / 42.1, rel=0.025)
    assert all(1.25 <= gain <= 1.33 for gain in gains.values()), gains


def test_a_trillion_parameters_on_3072_gpus_plans_and_fits() -> None:
    """The time it takes is measured by benchmarks/planner_published.py (0.3-0.4 s idle,
    recorded in BENCHMARKS.md); here only a ceiling far above it, so a busy machine cannot
    fail the suite while a search that blew up still would."""
    assert ONE_T.params > 1e12
    seconds, best = time_one_trillion()
    assert seconds < 30.0
    assert best.fits and best.candidate.world_size == 3072 and best.usd_per_million_tokens > 0
    assert best.reason.startswith(best.candidate.describe())


def test_plans_are_ranked_and_carry_their_figures() -> None:
    dims = ModelDims.from_gpt(24, 2048, 16, 8192, 32000, 2048, 2048)
    plans = plan(dims, Workload(global_batch=64), "h100-sxm", 16, usd_per_device_hour=2.0)
    times = [p.step_s for p in plans]
    assert times == sorted(times)
    for p in plans:
        assert p.fits and 0 < p.mfu < 1 and 0 < p.scaling_efficiency <= 1.0 + 1e-9
        assert p.tokens_per_s == pytest.approx(64 * 2048 / p.step_s)


def test_tensor_parallel_over_pcie_without_p2p_is_punished() -> None:
    dims = ModelDims.from_gpt(24, 2048, 16, 8192, 32000, 2048, 2048)
    work = Workload(global_batch=32)
    tp8 = Layout(1, 1, 8, 1, 1, 4, 1, "none")
    dp8 = Layout(1, 8, 1, 1, 1, 4, 1, "none")
    on_4090 = node_shape("rtx4090")
    on_h100 = node_shape("h100-sxm")
    ratio_4090 = step_time(dims, work, tp8, on_4090)["total"] / \
        step_time(dims, work, dp8, on_4090)["total"]
    ratio_h100 = step_time(dims, work, tp8, on_h100)["total"] / \
        step_time(dims, work, dp8, on_h100)["total"]
    assert ratio_4090 > 2 * ratio_h100


def test_nothing_fits_names_the_smallest_change() -> None:
    dims = ModelDims(32, 5120, 40, 13824, 32000, 4096, gated_mlp=True)  # ~10.5B
    with pytest.raises(NothingFits) as caught:
        plan(dims, Workload(global_batch=16), "rtx4090", 2)
    message = str(caught.value)
    assert "does not fit" not in message and "needs" in message and "To fix" in message
    suggestions = caught.value.suggestions
    assert any(s.startswith("use ") and "x rtx4090" in s for s in suggestions), suggestions
    assert any("GiB)" in s for s in suggestions), suggestions  # a device with more memory


# ---------------------------------------------------------------- properties of the model


dims_strategy = st.builds(
    lambda layers, dim_k, heads, vocab, seq: ModelDims.from_gpt(
        layers, 64 * dim_k, heads, 4 * 64 * dim_k, vocab, seq, seq),
    st.integers(2, 48), st.integers(1, 32), st.sampled_from([4, 8, 16]),
    st.sampled_from([8192, 32000, 128256]), st.sampled_from([512, 2048, 8192]),
)
candidate_strategy = st.builds(
    Layout,
    st.sampled_from([1, 2]), st.sampled_from([1, 2, 8]), st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]), st.just(1), st.sampled_from([1, 2, 4]), st.sampled_from([2, 4, 8]),
    st.sampled_from(["none", "selective", "full"]),
)


@settings(max_examples=200, deadline=None)
@given(dims_strategy, candidate_strategy, st.sampled_from(list(GPUS)))
def test_memory_never_falls_when_the_microbatch_grows(
    dims: ModelDims, c: Layout, kind: str
) -> None:
    shape = node_shape(kind)
    work = Workload(global_batch=64)
    bigger = replace(c, micro_batch_size=c.micro_batch_size * 2)
    assert memory_per_device(dims, work, bigger, shape) >= memory_per_device(dims, work, c, shape)


@settings(max_examples=200, deadline=None)
@given(dims_strategy, candidate_strategy, st.sampled_from(["h100-sxm", "rtx4090", "l40s"]),
       st.floats(1.1, 10.0))
def test_more_bandwidth_never_predicts_a_slower_step(
    dims: ModelDims, c: Layout, kind: str, factor: float
) -> None:
    shape = node_shape(kind)
    faster = replace(
        shape,
        gpu=replace(shape.gpu, memory_bandwidth=shape.gpu.memory_bandwidth * factor,
                    staging_bandwidth=shape.gpu.copy_bandwidth * factor),
        intra=replace(shape.intra, bandwidth=shape.intra.bandwidth * factor),
        inter=replace(shape.inter, bandwidth=shape.inter.bandwidth * factor),
    )
    work = Workload(global_batch=64)
    assert step_time(dims, work, c, faster)["total"] <= step_time(dims, work, c, shape)["total"]


@settings(max_examples=30, deadline=None)
@given(dims_strategy, st.sampled_from([8, 16, 64]), st.sampled_from(["h100-sxm", "rtx4090"]))
def test_no_plan_exceeds_device_memory(dims: ModelDims, gpus: int, kind: str) -> None:
    try:
        plans = plan(dims, Workload(global_batch=128), kind, gpus)
    except NothingFits:
        return
    limit = GPUS[kind].memory_bytes
    assert all(p.memory_bytes <= limit for p in plans)
    assert all(p.candidate.world_size == gpus for p in plans)


def test_every_candidate_uses_all_devices_and_divides_the_batch() -> None:
    dims = ModelDims.from_gpt(8, 512, 8, 2048, 8192, 1024, 1024)
    for c in candidates(dims, Workload(global_batch=48), 12, node_shape("l40s")):
        assert c.world_size == 12
        assert c.dp_replicate * c.dp_shard * c.micro_batch_size * c.microbatches == 48


def test_catalog_has_the_gpu_kinds_users_ask_for() -> None:
    assert {"rtx4090", "l40s", "a100-80gb-sxm", "h100-sxm", "h100-pcie", "h200", "cpu"} <= set(GPUS)
    assert node_shape("rtx4090").intra.name == "pcie4-no-p2p"
    assert isinstance(GPUS["h200"], GPUKind) and GPUS["h200"].memory_bytes > 140 * GiB * 0.9


def test_the_last_pipeline_stage_holds_the_logits_of_every_microbatch_in_flight() -> None:
    # Vocabulary-heavy, so the logits dominate the last stage: GPipe keeps all m microbatches'
    # logits and log-softmax until their backward, 1F1B one microbatch's.
    dims = ModelDims.from_gpt(4, 256, 4, 1024, 65536, 512, 512)
    work = Workload(global_batch=64, precision="fp32")
    shape = node_shape("h100-sxm")
    per_microbatch = 2 * 512 * 65536 * (4 + 4)  # tokens x vocab x (logits + log-softmax)

    def memory(m: int, gpipe: bool) -> float:
        c = Layout(1, 1, 1, 2, 1, 2, m, "none", schedule="gpipe" if gpipe else "1f1b")
        return memory_per_device(dims, work, c, shape)

    assert memory(16, gpipe=True) - memory(8, gpipe=True) >= 8 * per_microbatch
    assert memory(16, gpipe=False) == memory(8, gpipe=False)


class LiveBytes(TorchDispatchMode):
    """The bytes of every tensor the ops under it make, while they live, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key and key not in self.sizes:
                self.sizes[key] = storage.nbytes()
                self.now += storage.nbytes()
                self.peak = max(self.peak, self.now)
                weakref.finalize(storage, self._freed, key)
        return out

    def _freed(self, key: int) -> None:
        self.now -= self.sizes.pop(key)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_loss_holds_at_its_peak_what_the_planner_charges(precision: str) -> None:
    """raytrain's loss on logits from a (thin) head, as the loop computes it, its backward
    included: the peak of the live bytes over the logits' count is the planner's figure."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    tokens, vocab = 1024, 8192
    hidden = torch.randn(1, tokens, 8, dtype=dtype, requires_grad=True)
    head = torch.randn(vocab, 8, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (1, tokens))
    with LiveBytes() as live:
        loss = _cross_entropy(hidden @ head.T, targets)  # the logits go with the line
        held = live.now
        loss.backward()
    charged = loss_bytes_per_logit(Workload(global_batch=1, precision=precision), FSDP_2)
    assert held / (tokens * vocab) == pytest.approx(4, rel=0.02)  # the fp32 log-softmax
    assert live.peak / (tokens * vocab) == pytest.approx(charged, rel=0.02)


# The CPU validation's GPT (benchmarks.parallel_strategies.MODEL), FSDP over 2 CPU ranks.
BENCH_DIMS = ModelDims.from_gpt(4, 512, 8, 2048, 8192, 64, 64)
BENCH_WORK = Workload(global_batch=16, precision="fp32")
FSDP_2 = Layout(1, 2, 1, 1, 1, 2, 4, "none")


def test_fsdp_counts_the_gathered_root_and_the_reduce_scatter_input() -> None:
    dims, work, shape, fsdp = BENCH_DIMS, BENCH_WORK, node_shape("cpu"), FSDP_2
    root = dims.embedding_params + dims.head_params
    sharded_state = dims.params / 2 * 16
    # Root and two blocks gathered (fp32 here), and the root's unsharded fp32 gradient.
    gathered = (root + 2 * dims.block_params) * 4 + root * 4
    assert memory_per_device(dims, work, fsdp, shape) >= sharded_state + gathered


def test_fsdp_pays_for_its_copies_and_gathers_the_root_once() -> None:
    dims, work, shape, fsdp = BENCH_DIMS, BENCH_WORK, node_shape("cpu"), FSDP_2
    # Per microbatch, FSDP2 writes per all-gather the shard in and the unit out, per
    # reduce-scatter the fp32 gradients (chunk-cat, divided, the shard accumulated): the
    # blocks are gathered twice (forward, backward), the root once.
    root = dims.embedding_params + dims.head_params
    gathered = 2 * dims.block_params * dims.num_layers + root
    copied = 4 * (gathered * 1.5 + dims.params * 2.5) * fsdp.microbatches

    def total(copy_bandwidth: float) -> float:
        gpu = replace(shape.gpu, staging_bandwidth=copy_bandwidth)
        return step_time(dims, work, fsdp, replace(shape, gpu=gpu))["total"]

    assert total(1e9) - total(2e9) == pytest.approx(copied / 2e9, rel=1e-6)
    # Data parallel makes none of these copies.
    ddp = Layout(2, 1, 1, 1, 1, 2, 4, "none")
    slow = replace(shape, gpu=replace(shape.gpu, staging_bandwidth=1e6))
    assert step_time(dims, work, ddp, slow)["total"] == step_time(dims, work, ddp, shape)["total"]


def test_a_pipeline_runs_at_the_pace_of_its_slowest_rank() -> None:
    # Vocabulary-heavy: the rank holding the head does most of the work, and every
    # microbatch slot waits for it; an even split of the FLOPs would predict half.
    dims = ModelDims.from_gpt(4, 256, 4, 1024, 65536, 512, 512)
    work = Workload(global_batch=64, precision="fp32")
    shape = node_shape("h100-sxm")
    c = Layout(1, 1, 1, 2, 1, 2, 8, "none")
    peak = shape.gpu.fp32_flops * shape.gpu.gemm_efficiency * KERNELS.sustained
    head_alone = c.microbatches * 2 * 512 * 6 * dims.head_params / peak
    assert step_time(dims, work, c, shape)["compute"] >= head_alone


# ------------------------------------------------------- what-if: one layout, one cluster


def gpt_job(precision: str | None = None) -> JobSpec:
    """The shared 1B-class job on H100s, stating a precision only when given: what a plan
    assumes without one is under test here."""
    document = gpt_1b_job("h100-sxm")
    del document["training"]["precision"]
    if precision:
        document["training"]["precision"] = precision
    return JobSpec.model_validate(document)


def test_a_layout_asked_for_is_evaluated_exactly_on_the_shape_named() -> None:
    spec = gpt_job()
    answer = rank_plans(PlanRequest(spec=spec, layout=LayoutChoice(dp_shard=8, tp=2),
                                    shape="p4de"))
    [row] = answer.plans
    assert (answer.gpus, answer.accelerator, answer.shape) == (16, "a100-80gb-sxm", "p4de")
    assert answer.precision == "bf16"  # a GPU with bf16, and a spec that states none
    dims, work, _, _ = planner_inputs(spec, 16, "a100-80gb-sxm")
    layout = Layout(1, 8, 2, 1, 1, 4, 2, "none")  # 64 sequences: 8 ranks x 4 x 2
    expected = evaluate(dims, replace(work, precision="bf16"), layout, NODE_SHAPES["p4de"])
    assert row.layout == layout.describe() and row.step_s == expected.step_s
    assert row.memory_gib == pytest.approx(expected.memory_bytes / GiB) and row.fits
    assert row.breakdown["total"] == row.step_s and row.breakdown["compute"] > 0
    assert row.tflops_per_gpu * 1e12 == pytest.approx(
        row.tokens_per_s * dims.flops_per_token / 16)
    assert row.mfu == pytest.approx(row.tflops_per_gpu * 1e12 / GPUS["a100-80gb-sxm"].bf16_flops)
    # The precision a spec states wins; fp32 is several times slower on tensor-core GPUs.
    fp32 = rank_plans(PlanRequest(spec=gpt_job("fp32"), layout=LayoutChoice(dp_shard=8, tp=2),
                                  shape="p4de"))
    assert fp32.precision == "fp32" and fp32.plans[0].step_s > 2 * row.step_s


def test_node_shapes_are_the_machines_as_sold() -> None:
    per_gpu = {name: NODE_SHAPES[name].inter.bandwidth * 8 / 1e9
               for name in ("p4d", "p4de", "p5", "p5e", "dgx-a100", "dgx-h100")}
    assert per_gpu == pytest.approx({"p4d": 50, "p4de": 50, "p5": 400, "p5e": 400,
                                     "dgx-a100": 200, "dgx-h100": 400})  # Gbit/s per GPU
    # Memory as the device reports it (nvidia-smi's MiB), not the "40 GB" it is sold as.
    assert NODE_SHAPES["p4d"].gpu.memory_bytes == 40_960 * 2**20
    assert node_shape("a100-80gb-sxm").inter.bandwidth == NODE_SHAPES["p4de"].inter.bandwidth
    # Data parallel across 4 nodes waits on the network: p4d's 400 Gbit/s, not p5's 3,200.
    spec, choice = gpt_job(), LayoutChoice(dp_replicate=32, micro_batch_size=2)
    slow = rank_plans(PlanRequest(spec=spec, layout=choice, shape="dgx-a100")).plans[0]
    slower = rank_plans(PlanRequest(spec=spec, layout=choice, shape="p4de")).plans[0]
    assert slower.breakdown["total"] > slow.breakdown["total"]
    # A GPU cloud's shape is its offer's: 4090s without peer-to-peer.
    pod = rank_plans(PlanRequest(spec=spec, layout=LayoutChoice(tp=8),
                                 shape="runpod/secure/8x-rtx4090"), snapshot().offers)
    assert pod.shape == "runpod/secure/8x-rtx4090" and pod.accelerator == "rtx4090"


@pytest.mark.parametrize("request_fields, field, words", [
    ({"layout": LayoutChoice(dp_shard=2, tp=3)}, ("layout", "tp"), "does not divide"),
    ({"layout": LayoutChoice(dp_shard=2, tp=2), "gpus": 8}, ("layout",), "4 devices"),
    ({"layout": LayoutChoice(dp_shard=8, micro_batch_size=3)}, ("layout", "micro_batch_size"),
     "micro_batch_size in [1, 2, 4, 8]"),
    ({"shape": "p9"}, ("shape",), "p4de"),
    ({"shape": "p5", "accelerator": "rtx4090"}, ("accelerator",), "h100-sxm GPUs"),
    ({"layout": LayoutChoice(dp_shard=100_000, tp=1024)}, ("layout",), "102,400,000"),
])
def test_a_layout_or_shape_that_cannot_work_names_the_field_and_the_fix(
        request_fields: dict, field: tuple, words: str) -> None:
    with pytest.raises(SpecError) as caught:
        try:
            rank_plans(PlanRequest(spec=gpt_job(), **request_fields), snapshot().offers)
        except ValidationError as exc:  # refused by the request's own validation
            raise spec_error_from_validation(exc, source="plan request") from None
    error = caught.value.errors[0]  # tp=3 also cannot split the sequence: a second error
    assert error.loc == field and words in error.msg and "To fix" in error.msg
    assert caught.value.source == "plan request"


def test_plan_evaluates_a_layout_on_a_cluster_of_ones_own(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """`raytrain plan --layout ... --shape-file box.yaml --json`: a 4090 box on 25 GbE."""
    from raytrain.cli import main

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(gpt_job().model_dump(mode="json", exclude_unset=True)))
    box = tmp_path / "box.yaml"
    box.write_text("name: 4090-box\ngpu: rtx4090\ngpus_per_node: 8\nintra_link: pcie4-no-p2p\n"
                   "inter_gbits_per_gpu: 3.125\nrdma: false\n")
    argv = ["plan", str(job), "--shape-file", str(box), "--layout", "dp_shard=16,mb=1"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["shape"], report["gpus"], report["precision"]) == ("4090-box", 16, "bf16")
    [only] = report["plans"]
    assert only["layout"] == {"description": "dp_shard16 mb1x4", "dp_replicate": 1,
                              "dp_shard": 16, "tp": 1, "pp": 1, "virtual_stages": 1,
                              "micro_batch_size": 1, "microbatches": 4, "recompute": "none"}
    assert {"step_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory_gib",
            "breakdown"} <= only.keys()
    assert main(argv) == 0
    assert "16 x rtx4090 on 4090-box nodes, bf16" in capsys.readouterr().out
    assert main(["plan", str(job), "--layout", "dp_shard=16,tq=2"]) == 2
    assert "--layout" in capsys.readouterr().err
    box.write_text("gpu: rtx4090\ngpus_per_node: 8\ninter_gbits_per_gpu: 3\n")
    assert main([*argv]) == 2
    assert "intra_link" in capsys.readouterr().err


# Llama-3 8B's shape, 8 micro-batches of one sequence per step, FSDP over 8 GPUs.
LLAMA_3_8B = ModelDims(32, 4096, 32, 14336, 128256, 8192, num_kv_heads=8, gated_mlp=True)
EIGHT_MICRO_BATCHES = Workload(global_batch=64, micro_batch_options=(1,),
                               recompute_options=("full",))
FSDP8_ACCUM8 = Layout(1, 8, 1, 1, 1, 1, 8, "full")


def test_holding_fsdps_reduce_scatter_to_the_last_micro_batch_is_decided_by_memory() -> None:
    """With 8 micro-batches per step, FSDP2 reduce-scattering once per step is faster (one
    collective instead of eight) and holds every unsharded fp32 gradient: Llama-3 8B's 8
    GPUs choose it with 80 GB each, not with 40."""
    llama_8b, work, every = LLAMA_3_8B, EIGHT_MICRO_BATCHES, FSDP8_ACCUM8
    once = replace(every, reduce_scatter_once=True)
    shape = node_shape("h100-sxm")
    a, b = evaluate(llama_8b, work, every, shape), evaluate(llama_8b, work, once, shape)
    assert b.step_s < a.step_s
    # every unit's unsharded fp32 gradient, less the one unit's buffer held either way (the
    # root's: embeddings and head, 13% of the model)
    held = llama_8b.params * 4
    assert 0.8 * held < b.memory_bytes - a.memory_bytes < held
    ranked = [p.candidate for p in plan(llama_8b, work, "h100-sxm", 8, keep=50)]
    assert ranked.index(once) < ranked.index(every)
    on_40gb = plan(llama_8b, work, "a100-40gb-sxm", 8, keep=1)[0]
    assert on_40gb.fits and not on_40gb.candidate.reduce_scatter_once
    assert "reduce-scatter once" in once.describe()


def test_zero2_trades_the_backwards_gathers_for_the_whole_models_parameters() -> None:
    """ZeRO-2 (zero2) keeps every block gathered from its forward to its backward: the
    backward gathers nothing again (less data-parallel time), and at its start the whole
    model's parameters are held, not the root and two blocks. Where memory is short, the
    planner keeps FSDP's resharding; where it is not and gathers cost, it may choose zero2."""
    llama_8b, work, every = LLAMA_3_8B, EIGHT_MICRO_BATCHES, FSDP8_ACCUM8
    kept = replace(every, zero2=True)
    shape = node_shape("h100-sxm")
    a, b = evaluate(llama_8b, work, every, shape), evaluate(llama_8b, work, kept, shape)
    assert b.breakdown["data_parallel"] < a.breakdown["data_parallel"]
    root = (llama_8b.embedding_params + llama_8b.head_params) * 2
    gathered_more = llama_8b.params * 2 - root - 2 * llama_8b.block_params * 2
    assert b.memory_bytes - a.memory_bytes == pytest.approx(gathered_more, rel=1e-6)
    assert "zero2" in kept.describe()
    assert plan(llama_8b, work, "h100-sxm", 8, keep=1)[0].candidate.zero2  # faster, fits
    on_48gb = node_shape("l40s")  # 41 GB fits in its 44 usable, 54 does not
    assert evaluate(llama_8b, work, every, on_48gb).fits
    assert not evaluate(llama_8b, work, kept, on_48gb).fits


def test_float8_tensor_parallel_gathers_cost_half_the_bytes_of_bf16_ones() -> None:
    """Float8 linears under tensor parallelism all-gather their input in float8 (1 byte a
    value; their outputs' reduce-scatters stay bf16): the all-gathers' bandwidth halves, the
    reduce-scatters do not change, and 2 bytes a value is exactly the bf16 run."""
    llama_70b = ModelDims(80, 8192, 64, 28672, 128256, 8192, num_kv_heads=8, gated_mlp=True)
    work = Workload(global_batch=512, micro_batch_options=(16,), recompute_options=("full",))
    layout = Layout(1, 32, 8, 1, 1, 16, 1, "full")
    shape = node_shape("h100-sxm")

    def tp_s(**kwargs: float) -> float:
        return evaluate(llama_70b, replace(work, **kwargs), layout, shape).breakdown[
            "tensor_parallel"]

    bf16, fp8 = tp_s(), tp_s(tp_gather_bytes=1)
    assert tp_s(tp_gather_bytes=2) == pytest.approx(bf16)
    link = shape.intra
    bandwidth_share = 1 / (1 + link.reduce_scatter_factor)  # of the bytes' time: the gathers'
    assert fp8 < bf16 and bf16 - fp8 < bandwidth_share * bf16 / 2 + 1e-9
