#!/usr/bin/env bash
# GPU checks, for a machine with NVIDIA GPUs: the layout parity tests over NCCL, then the
# strategy throughput/memory/bubble benchmark on every GPU present. Run from the repository
# root after the README's install (a CUDA build of torch 2.13 or 2.14):
#
#     bash scripts/gpu_check.sh            # prints everything; exit status 0 if all passed
#
# The CPU test suite covers the same parity over gloo; this adds NCCL, CUDA kernels, bf16
# autocast and fp16 loss scaling on real devices.
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

if [ "$GPUS" -lt 2 ]; then
  echo "one GPU: the layout checks need 2 or more" >&2
  exit 1
fi
echo "== parity of every layout against one process, NCCL (4-rank layouts need 4 GPUs)"
RAYTRAIN_TEST_DEVICE=cuda "$PY" -m pytest -q tests/unit/test_parallel.py tests/unit/test_compression.py

RANKS=$(( GPUS >= 4 ? 4 : 2 ))
echo "== strategies on $RANKS GPUs (throughput, memory, pipeline bubble)"
"$PY" -m benchmarks.parallel_strategies --device cuda --ranks "$RANKS" --steps 20
echo "== gpu_check passed"
