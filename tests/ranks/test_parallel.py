"""Every parallel layout trains exactly like one process, checkpoints move between layouts,
and gradient compression converges. Plain processes over gloo (mp.spawn), no Ray.

All layouts of one rank count run one after another in one spawn (a spawn costs seconds of
imports per rank); each test then reads its layout's loss history. RAYTRAIN_TEST_DEVICE=cuda
runs the same over NCCL, one GPU per rank (scripts/gpu_check.sh).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from raytrain.core.resolve import job_layout
from raytrain.parallel.float8 import cpu_float8_unsupported
from raytrain.spec import JobSpec
from raytrain.testing.jobs import NoticeAfter, RecordingSink
from raytrain.testing.parity import (
    DEVICE,
    FOUR_RANKS,
    LLAMA,
    LLAMA_TWO_RANKS,
    LLAMA_UNTIED,
    STEPS,
    TWO_RANKS,
    _device,
    _losses,
    _spawn,
    job,
    user_job,
)
from raytrain.train.checkpoint import latest_checkpoint
from raytrain.train.loop import train
from raytrain.train.rank import WorkerInfo
from tests.support.tolerances import SUM_ORDER

# Llama's blocks: grouped-query attention, SwiGLU, rotary positions, tied embeddings (which a
# pipeline cannot split: its untied twin runs the pipeline layouts).






# Llama-style layouts: (model, parallel); each matches one process of its own model.
# precision fp8 (float8 linears, bf16 elsewhere): each matches one fp8 process of its model.
FP8_TWO_RANKS = {
    "fp8_dp2": (LLAMA, {"strategy": "data"}),
    "fp8_fsdp2": (LLAMA, {"strategy": "fsdp"}),
    "fp8_untied_pp2_1f1b": (LLAMA_UNTIED, {"strategy": "pipeline"}),
}
# torch's scaled matmul runs on GPUs of compute capability 8.9 or more, and on CPUs whose
# oneDNN has float8 kernels (probed once, in a child process: raytrain.parallel.float8).
FP8_NOT_HERE = ("no FP8 tensor cores on this GPU"
                if torch.cuda.get_device_capability(0) < (8, 9) else None) \
    if DEVICE == "cuda" else cpu_float8_unsupported()
FP8_HERE = FP8_NOT_HERE is None
# The fp8 cases' steps: one micro-batch of 2 on each of the two data ranks (or 2 micro-batches
# through the two stages), and no clipping. Then every sum a step makes across ranks has two
# terms, which fp32 adds alike in either order, and the divisions are by powers of two: the
# weights stay bitwise those of one process, on any CPU, whatever its kernels round to, as
# long as each kernel is deterministic for its shapes (the reference runs one thread, as a
# rank does). With two micro-batches a rank (four-term sums, grouped otherwise than one
# process's accumulation) or a clipping norm summed over shards, an fp32 ulp of difference
# crosses a float8 rounding now and then and the curves drift apart chaotically: 5e-4 at step
# 7 on one machine, none on another, 4e-3 here without clipping.
FP8_STEP = {"global_batch_size": 4, "grad_clip_norm": None}








# The collectives whose bytes each case records: (torch.distributed's function, where its
# tensor is as a keyword and as a position, the file its bytes go to).








def _single(document: dict, root: Path, **kwargs: Any) -> dict[int, float]:
    """One process's losses, on one thread as each rank runs (a kernel may split its sums
    by thread)."""
    sink = RecordingSink()
    spec = JobSpec.model_validate(document)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(spec, WorkerInfo(0, 1, _device(0)), sink, root, layout=job_layout(spec),
              progress_interval_s=0.0, **kwargs)
    finally:
        torch.set_num_threads(threads)
    return sink.losses()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    return _single(job(1), tmp_path_factory.mktemp("single"))


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two")
    cases = [(name, job(2, parallel), {}) for name, parallel in TWO_RANKS.items()]
    cases += [(f"user_{strategy}", user_job(2, strategy), {}) for strategy in ("data", "fsdp")]
    # FSDP with one micro-batch per step, for the reduce-scatter traffic of one
    cases.append(("fsdp2_one_micro_batch", job(2, {"strategy": "fsdp"}, micro_batch_size=4),
                  {}))
    # A layout change: 6 steps under tp2, then resume under dp2 (and, below, one process).
    cases.append(("cut_tp2", job(2, TWO_RANKS["tp2_sequence_parallel"],
                                 checkpoint_every_steps=6), {"stop_after_steps": 6}))
    cases.append(("resume_dp2", job(2, {"strategy": "data"}, checkpoint_every_steps=6),
                  {"resume_from": str(out / "cut_tp2" / "step_000000006")}))
    cases += [(name, job(2, parallel, model), {})
              for name, (model, parallel) in LLAMA_TWO_RANKS.items()]
    if FP8_HERE:
        cases += [(name, job(2, parallel, model, precision="fp8", **FP8_STEP), {})
                  for name, (model, parallel) in FP8_TWO_RANKS.items()]
    cases.append(("fsdp2_bf16_reduce", job(2, {"strategy": "fsdp", "grad_reduce_dtype": "bf16"}),
                  {}))
    cases.append(("fsdp2_bf16", job(2, {"strategy": "fsdp"}, precision="bf16"), {}))
    # Llama-style across layouts: 6 steps under tp2, then on under FSDP.
    cases.append(("llama_cut_tp2", job(2, {"strategy": "tensor"}, LLAMA,
                                       checkpoint_every_steps=6), {"stop_after_steps": 6}))
    cases.append(("llama_resume_fsdp2", job(2, {"strategy": "fsdp"}, LLAMA,
                                            checkpoint_every_steps=6),
                  {"resume_from": str(out / "llama_cut_tp2" / "step_000000006")}))
    _spawn(2, cases, out)
    return out


@pytest.fixture(scope="module")
def four_rank_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if DEVICE == "cuda" and torch.cuda.device_count() < 4:
        pytest.skip("four-rank layouts need 4 GPUs")
    out = tmp_path_factory.mktemp("four")
    cases = [(name, job(4, parallel), {}) for name, parallel in FOUR_RANKS.items()]
    # HSDP with 2 micro-batches per step (hsdp_dp2_fsdp2 has one).
    cases.append(("hsdp_accum2", job(4, FOUR_RANKS["hsdp_dp2_fsdp2"], micro_batch_size=1),
                  {}))
    # A job on 4 workers, cut at step 6 (it resumes on 2 below).
    cases.append(("cut_dp4", job(4, {"strategy": "data"}, checkpoint_every_steps=6),
                  {"stop_after_steps": 6}))
    _spawn(4, cases, out)
    return out


def _assert_every_step_matches(run: Path, reference: dict[int, float]) -> None:
    losses = _losses(run / "losses.json")
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in reference.items():
        assert losses[step] == pytest.approx(loss, abs=SUM_ORDER), (run.name, step)


@pytest.mark.parametrize("name", list(TWO_RANKS))
def test_two_rank_layout_matches_one_process(name: str, two_rank_runs: Path,
                                             reference: dict[int, float]) -> None:
    _assert_every_step_matches(two_rank_runs / name, reference)


@pytest.fixture(scope="module")
def llama_references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, float]]:
    return {"tied": _single(job(1, model=LLAMA), tmp_path_factory.mktemp("llama")),
            "untied": _single(job(1, model=LLAMA_UNTIED), tmp_path_factory.mktemp("untied"))}


@pytest.mark.parametrize("name", list(LLAMA_TWO_RANKS))
def test_llama_style_layout_matches_one_process(
        name: str, two_rank_runs: Path, llama_references: dict[str, dict[int, float]]) -> None:
    """Grouped-query attention, SwiGLU, rotary positions and tied embeddings under each
    layout; the reference is one process of the same model, which differs from GPT's (the
    last assertion: a model that ignored the options would match GPT's losses instead)."""
    model = LLAMA_TWO_RANKS[name][0]
    reference = llama_references["tied" if model is LLAMA else "untied"]
    _assert_every_step_matches(two_rank_runs / name, reference)


def test_llama_style_blocks_change_the_model_and_resume_across_layouts(
        two_rank_runs: Path, llama_references: dict[str, dict[int, float]],
        reference: dict[int, float]) -> None:
    tied = llama_references["tied"]
    assert abs(tied[1] - reference[1]) > 1e-3 and abs(tied[1] - llama_references["untied"][1]) \
        > 1e-6
    resumed = _losses(two_rank_runs / "llama_resume_fsdp2" / "losses.json")
    assert sorted(resumed) == list(range(7, STEPS + 1))
    for step in resumed:
        assert resumed[step] == pytest.approx(tied[step], abs=SUM_ORDER), step


@pytest.fixture(scope="module")
def fp8_references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, float]]:
    if not FP8_HERE:
        pytest.skip(FP8_NOT_HERE)
    return {name: _single(job(1, model=model, precision=precision, **{**FP8_STEP, **cut}),
                          tmp_path_factory.mktemp(name))
            for name, model, precision, cut in (
                ("tied", LLAMA, "fp8", {}), ("bf16", LLAMA, "bf16", {}),
                ("untied", LLAMA_UNTIED, "fp8", {}),
                ("tied_micro4", LLAMA, "fp8", {"micro_batch_size": 4}))}


# The weights are bitwise equal (FP8_STEP); what differs is the reported loss, a mean over
# the step's micro-batches taken in another order: a few fp32 ulps of a loss near 3.4 (one
# ulp is 2.4e-7), which never compound.
FP8_LOSS_ULPS = 1e-6


@pytest.mark.skipif(not FP8_HERE, reason=str(FP8_NOT_HERE))
@pytest.mark.parametrize("name", list(FP8_TWO_RANKS))
def test_fp8_layout_matches_one_fp8_process(
        name: str, two_rank_runs: Path, fp8_references: dict[str, dict[int, float]]) -> None:
    """Float8 linears (torchao's, dynamic tensorwise scaling) scale and round alike however
    the model is split by data or by stage: every step's loss equals one fp8 process's to
    FP8_LOSS_ULPS, on steps whose sums are ordered alike (FP8_STEP). That bound means
    something: scaling per micro-batch differently (one process taking the step as one
    micro-batch of 4 rather than two of 2) moves the losses by over 10x it, and one fp8
    process is not a bf16 one (float8 does change the numbers, by over 1e-3, which a
    conversion that did nothing would not)."""
    model = FP8_TWO_RANKS[name][0]
    reference = fp8_references["tied" if model is LLAMA else "untied"]
    losses = _losses(two_rank_runs / name / "losses.json")
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in reference.items():
        assert loss == pytest.approx(losses[step], abs=FP8_LOSS_ULPS), (name, step)
    fp8, bf16 = fp8_references["tied"], fp8_references["bf16"]
    assert max(abs(fp8[step] - bf16[step]) for step in fp8) > 1e-3
    cut = fp8_references["tied_micro4"]
    assert max(abs(fp8[step] - cut[step]) for step in fp8) > 10 * FP8_LOSS_ULPS


@pytest.mark.parametrize("name", list(FOUR_RANKS))
def test_four_rank_layout_matches_one_process(name: str, four_rank_runs: Path,
                                              reference: dict[int, float]) -> None:
    _assert_every_step_matches(four_rank_runs / name, reference)


def test_replicas_sync_gradients_once_per_step_however_many_micro_batches(
        four_rank_runs: Path, reference: dict[int, float]) -> None:
    """Data parallel through FSDP2 with replicas (HSDP here; data beside tensor parallel
    takes the same path) all-reduces across replicas on the last micro-batch only: the bytes
    per step do not grow with the micro-batch count, and the losses still match one
    process."""
    _assert_every_step_matches(four_rank_runs / "hsdp_accum2", reference)
    one = int((four_rank_runs / "hsdp_dp2_fsdp2" / "all_reduced_bytes").read_text())
    two = int((four_rank_runs / "hsdp_accum2" / "all_reduced_bytes").read_text())
    assert one > 0 and two / one < 1.1, (one, two)  # not 2x: once per step either way


def test_fsdp_can_reduce_scatter_once_per_step(two_rank_runs: Path) -> None:
    """FSDP with 2 micro-batches reduce-scatters after each (2x the traffic of one micro-batch
    per step) unless the layout holds it to the last (reduce_scatter_once): then it is once
    per step, and the losses still match one process (the parametrized test above)."""
    def scattered(name: str) -> int:
        return int((two_rank_runs / name / "reduce_scattered_bytes").read_text())

    one = scattered("fsdp2_one_micro_batch")
    assert one > 0
    assert 1.9 < scattered("fsdp2") / one < 2.1
    assert 0.9 < scattered("fsdp2_reduce_scatter_once") / one < 1.1


def test_zero2_gathers_parameters_once_per_micro_batch_as_the_cost_model_prices(
        two_rank_runs: Path) -> None:
    """FSDP2 gathers each block's parameters for its forward and again for its backward
    (the root unit once: it is not resharded after forward); with zero2 only for the
    forward. The bytes gathered match what the cost model charges (it fails with zero2 left
    out of parallelize, or of the cost model's regathered share), and the losses match one
    process (the parametrized test above)."""
    from raytrain.core.cost_model import root_params
    from raytrain.core.resolve import job_layout, planner_inputs

    def gathered(name: str) -> int:
        return int((two_rank_runs / name / "all_gathered_bytes").read_text())

    spec = JobSpec.model_validate(job(2, TWO_RANKS["fsdp2_zero2"]))
    dims, layout = planner_inputs(spec)[0], job_layout(spec)
    regathered = 1 - root_params(dims, layout) / dims.params
    predicted = 1 / (1 + regathered)  # zero2's gathers per micro-batch against FSDP2's
    assert gathered("fsdp2") > 0
    assert gathered("fsdp2_zero2") / gathered("fsdp2") == pytest.approx(predicted, rel=0.03)


def test_fsdp_can_reduce_gradients_in_bf16_at_half_the_traffic(
        two_rank_runs: Path, reference: dict[int, float]) -> None:
    """grad_reduce_dtype bf16: FSDP2 reduce-scatters bf16 gradients (half the bytes of fp32;
    the same bytes without the option fails), and the run stays on one process's curve to
    bf16's precision."""
    def scattered(name: str) -> int:
        return int((two_rank_runs / name / "reduce_scattered_bytes").read_text())

    assert 0.45 < scattered("fsdp2_bf16_reduce") / scattered("fsdp2") < 0.55
    losses = _losses(two_rank_runs / "fsdp2_bf16_reduce" / "losses.json")
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in reference.items():
        assert losses[step] == pytest.approx(loss, abs=2e-2), step


@pytest.mark.parametrize("strategy", ["data", "fsdp"])
def test_a_users_own_model_trains_alike_under_ddp_and_fsdp(
    strategy: str, two_rank_runs: Path, tmp_path: Path
) -> None:
    alone = _single(user_job(1, "data"), tmp_path)
    _assert_every_step_matches(two_rank_runs / f"user_{strategy}", alone)


def test_a_tp2_checkpoint_resumes_under_dp2_and_one_process(
    two_rank_runs: Path, tmp_path: Path, reference: dict[int, float]
) -> None:
    saved = two_rank_runs / "cut_tp2"
    assert latest_checkpoint(saved).name == "step_000000006"
    meta = json.loads((saved / "step_000000006" / "meta.json").read_text())
    assert meta["layout"]["tp"] == 2
    under_dp2 = _losses(two_rank_runs / "resume_dp2" / "losses.json")
    shutil.copytree(saved / "step_000000006", tmp_path / "step_000000006")
    under_one = _single(job(1, checkpoint_every_steps=6), tmp_path)
    for resumed in (under_dp2, under_one):
        assert sorted(resumed) == list(range(7, STEPS + 1))
        for step in resumed:
            assert resumed[step] == pytest.approx(reference[step], abs=SUM_ORDER), step


def test_a_notice_checkpoints_every_rank_at_one_step_and_a_reshaped_job_continues(
    four_rank_runs: Path, tmp_path: Path, reference: dict[int, float]
) -> None:
    """Rank 1 alone hears an interruption notice (after a rebalance recommendation): both
    ranks checkpoint at the same step and stop, losing no step; the job resumes from it. And a
    job cut on 4 workers resumes on 2 from the same kind of checkpoint. Both continue the
    uninterrupted loss curve to 1e-5, so no sample was skipped or seen twice."""
    dp2 = {"strategy": "data"}
    cases = [
        ("noticed", job(2, dp2), {"notices": NoticeAfter(rank=1, syncs=4,
                                                         rebalance_first=True)}),
        ("after_notice", job(2, dp2), {"resume_from": str(tmp_path / "noticed" /
                                                          "step_000000004")}),
        ("dp4_on_2", job(2, dp2), {"resume_from": str(four_rank_runs / "cut_dp4" /
                                                      "step_000000006")}),
    ]
    _spawn(2, cases, tmp_path)
    noticed = tmp_path / "noticed"
    # The rebalance recommendation checkpointed step 3; the notice step 4, then it stopped.
    assert sorted(p.name for p in noticed.glob("step_*")) == ["step_000000003",
                                                               "step_000000004"]
    assert sorted(_losses(noticed / "losses.json")) == [1, 2, 3, 4]
    for run, first in (("after_notice", 5), ("dp4_on_2", 7)):
        resumed = _losses(tmp_path / run / "losses.json")
        assert sorted(resumed) == list(range(first, STEPS + 1)), run
        for step in resumed:
            assert resumed[step] == pytest.approx(reference[step], abs=SUM_ORDER), (run, step)


def test_a_bf16_job_gathers_bf16_parameters_and_reduces_fp32_gradients(
        two_rank_runs: Path, reference: dict[int, float]) -> None:
    """precision bf16 under FSDP: parameters are gathered in bf16 (half the bytes of an fp32
    job's gathers: FSDP2's param_dtype, as the planner prices it; gathering fp32 under
    autocast gives the same bytes and fails), gradients are reduce-scattered in fp32 (the
    same bytes as fp32's), and the run follows one fp32 process's curve to bf16's precision."""
    def moved(name: str, what: str) -> int:
        return int((two_rank_runs / name / what).read_text())

    assert 0.45 < moved("fsdp2_bf16", "all_gathered_bytes") / \
        moved("fsdp2", "all_gathered_bytes") < 0.55
    assert moved("fsdp2_bf16", "reduce_scattered_bytes") == \
        moved("fsdp2", "reduce_scattered_bytes")
    losses = _losses(two_rank_runs / "fsdp2_bf16" / "losses.json")
    assert sorted(losses) == list(range(1, STEPS + 1))
    for step, loss in reference.items():
        assert losses[step] == pytest.approx(loss, abs=5e-2), step



@pytest.mark.skipif(not FP8_HERE, reason=str(FP8_NOT_HERE))
def test_fsdp_gathers_float8_weights_in_float8(two_rank_runs: Path) -> None:
    """An fp8 job under FSDP all-gathers its float8 linears' weights already cast (one byte a
    value; torchao's enable_fsdp_float8_all_gather), the rest (embeddings, norms) as the fp32
    job does: 0.28 of the fp32 job's bytes here. Without the float8 gathers it is 1.0 (the
    fp32 weights, cast after the gather; checked). Per micro-batch: each gathers the weights
    for its forward and again for its backward, and the fp8 job takes half as many
    (FP8_STEP)."""
    def gathered(name: str, micro_batches: int) -> float:
        return int((two_rank_runs / name / "all_gathered_bytes").read_text()) / micro_batches

    ratio = gathered("fp8_fsdp2", 1) / gathered("llama_fsdp2", 2)
    print(f"\nfp8 FSDP gathers {ratio:.3f} of the fp32 job's bytes")
    assert 0.2 < ratio < 0.35, ratio
