"""The planner against torchtitan's published H100 runs, and its speed on a 1T model.

Prints, for each published run (torchtitan docs/performance.md: H100 96 GB HBM2e at 500 W,
NVLink in a host, 400 Gbit/s RDMA per GPU, seq 8192), the published and predicted tokens/s
per GPU and memory, and the time to plan a 1.2T-parameter model on 3,072 H100s.
tests/unit/test_planner.py asserts on the same RUNS.

    python -m benchmarks.planner_torchtitan
"""

from __future__ import annotations

import time
from dataclasses import replace

from raytrain.catalog.hardware import GPUS, LINKS, GiB, NodeShape
from raytrain.core.planner import Layout, ModelDims, Plan, Workload, evaluate, plan

LLAMA_8B = ModelDims(32, 4096, 32, 14336, 128256, 8192, num_kv_heads=8, gated_mlp=True)
LLAMA_70B = ModelDims(80, 8192, 64, 28672, 128256, 8192, num_kv_heads=8, gated_mlp=True)
ONE_T = ModelDims(128, 25600, 160, 102400, 128256, 4096, num_kv_heads=16, gated_mlp=True)
GRAND_TETON = NodeShape("grand-teton", replace(GPUS["h100-sxm"], memory_bytes=96e9), 8,
                        LINKS["nvlink4"], LINKS["rdma-400-per-gpu"])
# torchtitan's own gains on Llama 3.1 8B (same page): torch.compile 6,667 / 5,762 tokens/s,
# then Float8 8,532 / 6,667. Its 70B figure uses both, so the prediction applies both.
COMPILE_AND_FLOAT8 = (6667 / 5762) * (8532 / 6667)

# (name, model, workload, layout, published tokens/s per GPU, published memory GiB)
RUNS = [
    ("Llama 3.1 8B, 8 GPUs, FSDP 8, eager, selective AC (calibration point)", LLAMA_8B,
     Workload(global_batch=2 * 8, recompute_options=("selective",)),
     Layout(1, 8, 1, 1, 1, 2, 1, "selective"), 5762, 82.4),
    ("Llama 3.1 8B, 128 GPUs, FSDP 128, eager, selective AC", LLAMA_8B,
     Workload(global_batch=2 * 128, recompute_options=("selective",)),
     Layout(1, 128, 1, 1, 1, 2, 1, "selective"), 5605, 67.0),
    ("Llama 3.1 70B, 256 GPUs, FSDP 32 x TP 8, compile + Float8, full AC", LLAMA_70B,
     Workload(global_batch=512, recompute_options=("full",), loss_parallel=True,
              compute_speedup=COMPILE_AND_FLOAT8),
     Layout(1, 32, 8, 1, 1, 16, 1, "full"), 829, 71.9),
]


def predict(dims: ModelDims, work: Workload, candidate: Layout) -> Plan:
    return evaluate(dims, work, candidate, GRAND_TETON)


def time_one_trillion() -> tuple[float, Plan]:
    started = time.perf_counter()
    plans = plan(ONE_T, Workload(global_batch=1536), "h100-sxm", 3072, usd_per_device_hour=2.0)
    return time.perf_counter() - started, plans[0]


def main() -> None:
    print("| run | published tokens/s/GPU | predicted | error | published GiB | predicted GiB |")
    print("|---|---|---|---|---|---|")
    for name, dims, work, candidate, published, memory in RUNS:
        p = predict(dims, work, candidate)
        per_gpu = p.tokens_per_s / candidate.world_size
        print(f"| {name} | {published:,} | {per_gpu:,.0f} | {per_gpu / published - 1:+.1%} | "
              f"{memory} | {p.memory_bytes / GiB:.1f} |")
    times = []
    for _ in range(3):
        seconds, best = time_one_trillion()
        times.append(seconds)
    print(f"\n{ONE_T.params / 1e12:.2f}T parameters on 3,072 H100s: planned in "
          f"{', '.join(f'{t:.2f}' for t in times)} s; best: {best.reason}")


if __name__ == "__main__":
    main()
