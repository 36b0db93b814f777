"""The compute model from the work's shapes (raytrain.core.kernels): matmul efficiency falls
where a shape cannot fill the GPU or is memory-bound, and attention and fused kernels cost
what the module says."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain.catalog.hardware import GPUS
from raytrain.core.dims import ModelDims, Workload
from raytrain.core.kernels import (
    KERNELS,
    MicrobatchShape,
    matmul_s,
    microbatch_compute_s,
)

H100 = GPUS["h100-sxm"]
PEAK = H100.bf16_flops
RATE = H100.gemm_efficiency * KERNELS.sustained


def efficiency(m: int, n: int, k: int) -> float:
    return 2 * m * n * k / matmul_s(m, n, k, H100, PEAK, 2, RATE) / PEAK


def test_a_large_matmul_runs_at_the_sustained_rate_and_small_ones_below_it() -> None:
    # 8 full waves of tiles.
    assert efficiency(128 * 132, 1024, 8192) == pytest.approx(RATE, rel=0.01)
    # One wave of 132 multiprocessors holds 132 tiles: 133 tiles take two waves.
    assert efficiency(128 * 12, 128 * 11, 16384) == pytest.approx(RATE, rel=0.01)
    assert efficiency(128 * 19, 128 * 7, 16384) == pytest.approx(RATE * 133 / 264, rel=0.01)
    # A thin matmul is memory-bound: its time is its bytes at HBM bandwidth.
    assert matmul_s(8192, 8, 8192, H100, PEAK, 2, RATE) == pytest.approx(
        (8192 * 8192 + 8192 * 8 + 8192 * 8) * 2 / H100.memory_bandwidth)


@settings(max_examples=50, deadline=None)
@given(m=st.integers(1, 1 << 16), n=st.integers(1, 1 << 16), k=st.integers(1, 1 << 16))
def test_no_matmul_runs_above_the_sustained_rate(m: int, n: int, k: int) -> None:
    assert efficiency(m, n, k) <= RATE * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(dim=st.sampled_from([256, 512, 1024, 2048, 4096, 8192]), tokens=st.sampled_from([1, 2, 8]))
def test_wider_models_use_the_gpu_better(dim: int, tokens: int) -> None:
    def flops_per_s(width: int) -> float:
        dims = ModelDims(4, width, width // 64, 4 * width, 32000, 2048)
        shape = MicrobatchShape(tokens, 1, "none", True)
        seconds = microbatch_compute_s(dims, Workload(global_batch=8), H100, shape, 4, True,
                                       0.0)
        return tokens * 2048 * dims.flops_per_token / seconds

    assert flops_per_s(dim) <= flops_per_s(dim * 2) * (1 + 1e-9)


def test_fused_kernels_and_flash_attention_cost_less_than_eager_and_unfused() -> None:
    dims = ModelDims(8, 2048, 16, 8192, 32000, 4096)
    shape = MicrobatchShape(1, 1, "none", True)
    eager = Workload(global_batch=8)

    def seconds(work: Workload) -> float:
        return microbatch_compute_s(dims, work, H100, shape, 8, True, 0.0)

    assert seconds(replace(eager, fused_elementwise=True)) < seconds(eager)
    assert seconds(replace(eager, attention="unfused")) > seconds(eager)
    # Full recomputation runs the blocks' forward again: 4/3 of their time, not the head's.
    full = microbatch_compute_s(dims, eager, H100, replace(shape, recompute="full"), 8, False, 0)
    plain = microbatch_compute_s(dims, eager, H100, shape, 8, False, 0.0)
    assert full == pytest.approx(plain * 4 / 3)
