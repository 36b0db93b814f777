"""precision 'fp8': which layers run in float8, where the spec and the planner allow it, and
which offers a job may buy. The training itself is in tests/ranks/test_parallel.py."""

from __future__ import annotations

import pytest

from raytrain.core.resolve import rank_plans
from raytrain.core.throughput import device_mismatch, offer_matches
from raytrain.errors import SpecError
from raytrain.models.gpt import GPT
from raytrain.parallel.float8 import float8_layers, to_float8
from raytrain.spec import GPTConfig, JobSpec, PlanRequest, parse_job_spec
from raytrain.spec.files import snapshot


def _job(**resources) -> JobSpec:
    return parse_job_spec({
        "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                          "max_seq_len": 16}},
        "data": {"seq_len": 16},
        "training": {"steps": 2, "global_batch_size": 8, "micro_batch_size": 4,
                     "precision": "fp8"},
        "parallel": {"strategy": "fsdp"},
        "resources": {"num_workers": 2, **resources}})


def test_every_block_linear_runs_in_float8_but_the_head_and_odd_sizes():
    model = to_float8(GPT(GPTConfig(vocab_size=64, dim=32, num_layers=2, num_heads=4,
                                    max_seq_len=16, mlp="swiglu", ffn_dim=48)))
    layers = float8_layers(model)
    assert len(layers) == 2 * 7 and "output" not in layers  # q, k, v, o, w1, w2, w3
    odd = to_float8(GPT(GPTConfig(vocab_size=64, dim=24, num_layers=1, num_heads=4,
                                  max_seq_len=16, ffn_dim=32)))
    assert float8_layers(odd) == []  # 24 is no multiple of 16: torch's scaled matmul refuses


def test_fp8_is_refused_on_gpus_without_fp8_uncompiled_and_with_tensor_parallelism():
    with pytest.raises(SpecError, match="FP8 tensor cores.*h100-sxm"):
        _job(gpus_per_worker=1, accelerator="a100-80gb-sxm")
    with pytest.raises(SpecError, match="tensor parallelism"):
        parse_job_spec({**_job().model_dump(exclude_unset=True),
                        "parallel": {"strategy": "tensor"}})
    _job(gpus_per_worker=1, accelerator="h100-sxm")  # fine: compiled, as GPU jobs are
    eager = {**_job(gpus_per_worker=1, accelerator="h100-sxm").model_dump(exclude_unset=True)}
    eager["training"] = {**eager["training"], "compile": False}
    with pytest.raises(SpecError, match="training.compile unset or true"):
        parse_job_spec(eager)
    parse_job_spec({**eager, "resources": {"num_workers": 2}})  # CPU: emulated, eager is fine
    spec = _job()
    with pytest.raises(SpecError, match="no FP8 tensor cores"):
        rank_plans(PlanRequest(spec=spec, accelerator="a100-80gb-sxm", gpus=8,
                               precision="fp8"))


def test_an_fp8_gpu_job_buys_only_gpus_with_fp8():
    offers = snapshot().offers
    spec = _job(gpus_per_worker=1)
    kinds = {o.gpu_kind for o in offers if offer_matches(spec, o)}
    assert kinds and all(k in ("h100-sxm", "h100-pcie", "h200", "l40s", "rtx4090")
                         for k in kinds)
    older = [o for o in offers if o.gpu_kind in ("t4", "v100-16gb")]
    assert older and "FP8" in (device_mismatch(spec, older) or "")


def test_fp8_plans_are_faster_on_an_h100_and_never_tensor_parallel():
    spec = JobSpec.model_validate({
        **_job().model_dump(exclude_unset=True),
        "model": {"gpt": {"vocab_size": 32000, "dim": 4096, "num_layers": 32,
                          "num_heads": 32, "max_seq_len": 4096}},
        "data": {"seq_len": 4096}, "parallel": {"strategy": "auto"},
        "training": {"steps": 2, "global_batch_size": 64, "micro_batch_size": 1,
                     "precision": "bf16"}})
    bf16, fp8 = (rank_plans(PlanRequest(spec=spec, accelerator="h100-sxm", gpus=8, precision=p,
                                        keep=200))
                 for p in ("bf16", "fp8"))
    assert fp8.precision == "fp8" and all(row.tp == 1 for row in fp8.plans)
    with pytest.raises(SpecError, match="tensor parallelism"):
        rank_plans(PlanRequest(spec=spec, accelerator="h100-sxm", precision="fp8",
                               layout={"dp_shard": 4, "tp": 2}))
    assert fp8.plans[0].tokens_per_s > 1.1 * bf16.plans[0].tokens_per_s


def test_a_cpu_without_float8_kernels_is_named_and_its_fp8_jobs_refused() -> None:
    """Where oneDNN has no float8 matmul (a CPU before AVX-512 FP16, or ONEDNN_MAX_CPU_ISA
    below it), the probe's child fails as a worker would, and says why; an fp8 job on CPU
    workers is then refused at submit naming training.precision and the hardware it needs.
    Other precisions, and fp8 on GPU workers, never ask."""
    from raytrain.parallel.float8 import cpu_float8_unsupported
    from raytrain.serve.jobs.admission import check_cpu_precision

    why = cpu_float8_unsupported(probe="raise RuntimeError('could not create a primitive "
                                 "descriptor for the matmul primitive')")
    assert why is not None and "primitive descriptor" in why
    cpu_fp8 = _job(num_workers=1)
    with pytest.raises(SpecError) as refused:
        check_cpu_precision(cpu_fp8, lambda: why)
    [error] = refused.value.errors
    assert error.loc == ("training", "precision") and "AVX-512 FP16" in error.msg
    assert "To fix" in error.msg
    check_cpu_precision(cpu_fp8, lambda: None)

    def never() -> str:
        raise AssertionError("asked for a job that does not need float8 on this CPU")

    bf16 = parse_job_spec({**cpu_fp8.model_dump(mode="json"),
                           "training": {**cpu_fp8.training.model_dump(mode="json"),
                                        "precision": "bf16"}})
    check_cpu_precision(bf16, never)
    check_cpu_precision(_job(gpus_per_worker=1, accelerator="h100-sxm"), never)
