#!/usr/bin/env bash
# GPU checks, for a machine with NVIDIA GPUs. Run from the repository root with a CUDA build
# of torch 2.13 or 2.14, torchao and raytrain's dependencies importable:
#
#     bash scripts/gpu_check.sh            # PYTHON=python3 to use another interpreter
#
# Prints everything and writes the figures as JSON to $GPU_CHECK_OUT (default $OUT, else
# ./gpu_check_results). Exit status 0 if every part ran.
#
# 1. The truth table (benchmarks/gpu_truth.py) on one GPU: for the built-in GPT of about
#    1.4B parameters and a Llama-style model of about 2.8B, raytrain bf16 eager, bf16
#    compiled, fp8 compiled (GPUs with FP8 tensor cores) and a torchtitan-style loop
#    (compiled, FSDP2 with bf16 parameters): step time with the data wait apart, tokens/s,
#    MFU, peak memory, the planner's prediction beside each, and the top kernels of
#    raytrain's bf16 compiled step. About 7 minutes on one H100, most of it compiling.
#    Then a mixture of experts' grouped GEMM (torch._grouped_mm) against the loop of experts
#    the CPU runs (tests/pure/test_moe.py, marked gpu).
# 2. With 2 GPUs or more: the same rows over FSDP on all of them (the 1.4B GPT), the layout
#    parity tests over NCCL, and the strategies' throughput and memory.
# Nothing is fetched: the models are built in place and the data are synthetic tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RESULTS=${GPU_CHECK_OUT:-${OUT:-gpu_check_results}}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1
began=$SECONDS
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -lt 1 ]; then
  echo "no CUDA device visible to torch; nothing to check" >&2
  exit 1
fi
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $GPUS GPU(s): $("$PY" -c "import torch; print(torch.cuda.get_device_name(0), 'torch', torch.__version__, 'CUDA', torch.version.cuda)")"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv || true

echo "== the truth table, one GPU"
"$PY" -m benchmarks.gpu_truth --ranks 1 --json "$RESULTS/truth_1gpu.json"
echo "== ($(( SECONDS - began )) s so far)"
echo "== a mixture of experts' grouped GEMM against the loop of experts"
"$PY" -m pytest -q -m gpu tests/pure/test_moe.py
if [ "$GPUS" -ge 2 ]; then
  echo "== the truth table, $GPUS GPUs (FSDP)"
  "$PY" -m benchmarks.gpu_truth --ranks "$GPUS" --models gpt-1.4b \
    --json "$RESULTS/truth_${GPUS}gpu.json"
  echo "== parity of every layout against one process, NCCL (4-rank layouts need 4 GPUs)"
  RAYTRAIN_TEST_DEVICE=cuda "$PY" -m pytest -q tests/ranks/test_parallel.py tests/ranks/test_compression.py
  RANKS=$(( GPUS >= 4 ? 4 : 2 ))
  echo "== strategies on $RANKS GPUs (throughput and memory)"
  "$PY" -m benchmarks.parallel_strategies --device cuda --ranks "$RANKS" --steps 20 --only throughput
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu --format=csv || true
echo "== gpu_check passed in $(( SECONDS - began )) s"
