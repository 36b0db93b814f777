"""The compute time of one micro-batch on one device, from the work's shapes: each matmul's
M, N and K, the attention, and the memory-bound work between them. raytrain.core.cost_model
adds the collectives and the schedule around it.

    shape = MicrobatchShape(micro_batch_size=2, tp=8, recompute="full", sequence_parallel=True)
    seconds = microbatch_compute_s(dims, work, gpu, shape, layers=10, head=True, flops_per_token=f)

No library predicts a kernel's time from its shape without running it (the GEMM tables
vendors and benchmarks publish are measurements, not a model), so this is a small one of our
own, each part stated:

- **A matmul** of M x K by K x N takes the longer of its FLOPs at `gpu.gemm_efficiency` x
  `KERNELS.sustained` of peak (the largest matmul a benchmark reaches, then what training
  sustains of it: clocks under load, gaps between kernels) and its bytes (M*K + K*N + M*N
  values) at the memory bandwidth. Its output is cut into 128 x 128 tiles, one per
  streaming multiprocessor at a time; the last wave's idle ones count (wave quantisation).
  A linear layer's backward is two matmuls of the same FLOPs with the dimensions swapped
  (gradient of the input: M x N by N x K; of the weight: K x M by M x N).
- **Attention.** FlashAttention-style kernels (PyTorch's scaled_dot_product_attention on a
  GPU, raytrain's and torchtitan's path) skip the masked half of a causal square and run at
  `KERNELS.flash_vs_gemm` of the matmul rate. The unfused path (Megatron-LM before 2022)
  runs both batched matmuls (every head's tiles in one kernel's waves) over the whole square
  and moves the scores through memory
  `KERNELS.softmax_passes` times (scale, mask, softmax, dropout, forward and backward).
- **Everything else** (norms, activations, residual adds, dropout, rotary embeddings) is
  memory-bound: each block's activation values cross memory `KERNELS.elementwise_passes`
  times, fewer where kernels are fused (torch.compile, Megatron's fused kernels) than in
  eager PyTorch. With sequence parallelism they are split over the tensor-parallel ranks;
  without it only the MLP's are.
- **Float8** (precision fp8, GPUs with FP8 tensor cores): a block's linears run their three
  matmuls at `gpu.fp8_flops` (one byte a value), after scaling and casting their input,
  weight and output gradient (FLOAT8_CAST_BYTES through memory per value); the attention
  and the head stay bf16.
- Full recomputation runs every block's forward twice: x4/3 on all of the above.
  Selective recomputation: +5%.

The constants in KERNELS are fitted to published end-to-end runs and validated on others
(benchmarks/published_runs.yaml, `python -m benchmarks.planner_published`, which prints
the fit and both sets' errors). The CPU profile (`gpu.gemm_efficiency` None) is measured
end to end on the whole step of a GPT by benchmarks/calibrate_cpu.py, so there all FLOPs run
at `gpu.achievable` of its measured rate and nothing is added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from raytrain.catalog.hardware import GPUKind

TILE = 128


@dataclass(frozen=True)
class MicrobatchShape:
    """What of a layout a micro-batch's compute depends on."""
    micro_batch_size: int
    tp: int
    recompute: str
    sequence_parallel: bool


@dataclass(frozen=True)
class KernelModel:
    sustained: float  # of the benchmark's best matmul rate, in training
    flash_vs_gemm: float  # fused attention's rate over the matmul rate
    softmax_passes: float  # score values' trips through memory, unfused attention
    elementwise_passes: float  # activation values' trips through memory, eager PyTorch
    fused_elementwise_passes: float  # the same with fused kernels


# Fitted by `python -m benchmarks.planner_published --fit` on the runs marked `fit` in
# benchmarks/published_runs.yaml (Megatron-LM's 1.7B, 18B and 1T on A100s, torchtitan's
# Llama 3.1 8B eager and compiled on H100s); flash_vs_gemm is FlashAttention-2's paper figure
# (A100, head dim 128, causal, forward and backward: about 60% of peak, 0.70 of the best
# matmul's 85.9%), not fitted.
KERNELS = KernelModel(sustained=0.84, flash_vs_gemm=0.70, softmax_passes=22.0,
                      elementwise_passes=20.0, fused_elementwise_passes=4.0)


def matmul_s(m: float, n: float, k: float, gpu: GPUKind, flops: float, value_bytes: int,
             rate: float, batch: float = 1) -> float:
    """Seconds for `batch` M x K by K x N matmuls in one kernel at `rate` of `flops` peak
    (tiles and memory as the module says; a batch's tiles share the waves)."""
    tiles = batch * math.ceil(m / TILE) * math.ceil(n / TILE)
    waves = math.ceil(tiles / gpu.sms) if gpu.sms else 0
    wave_use = tiles / (waves * gpu.sms) if waves else 1.0
    compute = batch * 2.0 * m * n * k / (flops * rate * wave_use)
    memory = batch * (m * k + k * n + m * n) * value_bytes / gpu.memory_bandwidth
    return max(compute, memory)


def linear_s(m: float, k: float, n: float, gpu: GPUKind, flops: float, value_bytes: int,
             rate: float, weight_grad: bool = True) -> float:
    """Forward and backward of a linear layer: tokens m, in k, out n; a frozen weight's
    (`weight_grad` False: LoRA's base weights) backward computes its input's gradient only."""
    return (matmul_s(m, n, k, gpu, flops, value_bytes, rate)
            + matmul_s(m, k, n, gpu, flops, value_bytes, rate)
            + (matmul_s(k, n, m, gpu, flops, value_bytes, rate) if weight_grad else 0.0))


# Float8 training (torchao's Float8Linear, dynamic tensorwise scaling) scales each linear's
# input, weight and output gradient by its absolute maximum and casts it to float8: read for
# the maximum, read again to cast, write one byte; 5 bytes a bf16 value in eager PyTorch,
# 3 where compilation fuses the maximum into the op that made the tensor. Stated, not fitted.
FLOAT8_CAST_BYTES = {False: 5.0, True: 3.0}


def _block_linear_s(tokens: float, k: float, n: float, gpu: GPUKind, work: Work,
                    flops: float, rate: float) -> float:
    """A block's linear, forward and backward; under fp8 its three matmuls run at the FP8
    rate and its input, weight and output gradient are scaled and cast first."""
    if work.precision != "fp8" or not gpu.fp8_flops:  # no FP8 cores: refused before here
        return linear_s(tokens, k, n, gpu, flops, work.act_bytes, rate, not work.frozen_weights)
    casts = (tokens * k + k * n + tokens * n) * FLOAT8_CAST_BYTES[work.fused_elementwise]
    return linear_s(tokens, k, n, gpu, gpu.fp8_flops, 1, rate, not work.frozen_weights) \
        + casts / gpu.memory_bandwidth


class Dimensions(Protocol):
    """What a micro-batch's timing reads of a model (dims.ModelDims is one)."""

    @property
    def dim(self) -> int: ...
    @property
    def seq_len(self) -> int: ...
    @property
    def mlp_width(self) -> float: ...
    @property
    def gated_mlp(self) -> bool: ...
    @property
    def kv_dim(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    def activation_values_on_rank(self, tp: int, sequence_parallel: bool) -> float: ...


class Work(Protocol):
    """What a micro-batch's timing reads of a workload (dims.Workload is one)."""

    @property
    def precision(self) -> str: ...
    @property
    def attention(self) -> str: ...
    @property
    def fused_elementwise(self) -> bool: ...
    @property
    def kernels(self) -> KernelModel: ...
    @property
    def act_bytes(self) -> int: ...
    @property
    def frozen_weights(self) -> bool: ...


@lru_cache(maxsize=65536)  # the planner's search asks for the same few ranks many times
def microbatch_compute_s(dims: Dimensions, work: Work, gpu: GPUKind, c: MicrobatchShape,
                         layers: int, head: bool, flops_per_token: float) -> float:
    """One micro-batch's forward and backward through `layers` blocks (plus the head when the
    rank holds it) on one device. `flops_per_token` is the rank's share that cost_model
    counts, used as it stands for a device without a GEMM model (the CPU)."""
    tokens = c.micro_batch_size * dims.seq_len
    recompute = {"full": 4 / 3, "selective": 1.05}.get(c.recompute, 1.0)
    if gpu.gemm_efficiency is None:
        return tokens * flops_per_token * recompute / c.tp / (
            gpu.flops(work.precision) * gpu.achievable) \
            + layers * gpu.block_overhead_s
    flops = gpu.flops(work.precision)
    rate = gpu.gemm_efficiency * work.kernels.sustained
    b = work.act_bytes
    d, tp = dims.dim, c.tp
    mlp_out = dims.mlp_width * (2 if dims.gated_mlp else 1)
    # (in, out) of the block's four linears on this rank
    linears = ((d, (d + 2 * dims.kv_dim) / tp), (d / tp, d), (d, mlp_out / tp),
               (dims.mlp_width / tp, d))
    block = sum(_block_linear_s(tokens, k, n, gpu, work, flops, rate) for k, n in linears)
    heads = dims.num_heads / tp
    sequences = c.micro_batch_size * heads
    if work.attention == "flash":
        attention_flops = 3 * 4 * sequences * dims.seq_len ** 2 * (d / dims.num_heads)
        block += attention_flops / 2 / (flops * rate * work.kernels.flash_vs_gemm)
    else:
        head_dim = d / dims.num_heads
        seq = dims.seq_len
        block += 3 * (matmul_s(seq, seq, head_dim, gpu, flops, b, rate, sequences)
                      + matmul_s(seq, head_dim, seq, gpu, flops, b, rate, sequences))
        block += sequences * dims.seq_len ** 2 * b * work.kernels.softmax_passes \
            / gpu.memory_bandwidth
    values = dims.activation_values_on_rank(tp, c.sequence_parallel)
    passes = work.kernels.fused_elementwise_passes if work.fused_elementwise \
        else work.kernels.elementwise_passes
    block += tokens * values * b * passes / gpu.memory_bandwidth
    total = layers * block * recompute
    if head:
        total += linear_s(tokens, d, dims.vocab_size / tp, gpu, flops, b, rate,
                          not work.frozen_weights)
    return total + layers * gpu.block_overhead_s
