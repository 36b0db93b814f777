#!/usr/bin/env bash
# GPU checks, for a machine with NVIDIA GPUs. Run from the repository root after the README's
# install (a CUDA build of torch 2.13 or 2.14):
#
#     bash scripts/gpu_check.sh            # prints everything; exit status 0 if all passed
#
# 1. The truth table (benchmarks/gpu_truth.py), on one GPU and then on all of them: the
#    built-in GPT's measured step time, tokens/s and peak memory beside the planner's
#    prediction, and a torchtitan-style loop on the same model beside raytrain's. About
#    1-2 minutes per GPU count.
# 2. With 2 GPUs or more: the layout parity tests over NCCL, then the strategies' throughput
#    and memory. The CPU suite covers the same parity over gloo; this adds NCCL, CUDA
#    kernels, bf16 autocast, fp16 loss scaling and (on GPUs with FP8 tensor cores) float8
#    linears on real devices.
# Nothing is fetched: the models are built in place and the data are random tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -lt 1 ]; then
  echo "no CUDA device visible to torch; nothing to check" >&2
  exit 1
fi
echo "== $GPUS GPU(s): $("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

echo "== predicted against measured, one GPU"
"$PY" -m benchmarks.gpu_truth --ranks 1 --steps 20
if [ "$GPUS" -ge 2 ]; then
  echo "== predicted against measured, $GPUS GPUs"
  "$PY" -m benchmarks.gpu_truth --ranks "$GPUS" --steps 20
  echo "== parity of every layout against one process, NCCL (4-rank layouts need 4 GPUs)"
  RAYTRAIN_TEST_DEVICE=cuda "$PY" -m pytest -q tests/ranks/test_parallel.py tests/ranks/test_compression.py
  RANKS=$(( GPUS >= 4 ? 4 : 2 ))
  echo "== strategies on $RANKS GPUs (throughput and memory)"
  "$PY" -m benchmarks.parallel_strategies --device cuda --ranks "$RANKS" --steps 20 --only throughput
fi
echo "== gpu_check passed"
