"""The CPU device profile for the planner, and the planner's predictions against measurement.

1. Profile: the FLOP/s one rank reaches on a training step of the benchmark GPT (one process,
   one thread; FLOPs counted as the planner counts them), and gloo's all-gather bandwidth and
   latency between two processes (a least-squares line through times of 64 KiB - 16 MiB).
   Paste the printed figures into raytrain/core/hardware.py ("cpu" and "gloo-local").
2. Validation (`--validate`): for layouts on 2 and 4 ranks, the planner's step time and
   memory per rank against raytrain's loop under torchrun (benchmarks/parallel_strategies.py
   measures), with the error of each and the median.

    python -m benchmarks.calibrate_cpu [--validate]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # torchrun runs this file as a script

from benchmarks.parallel_strategies import MODEL, SEQ, run  # noqa: E402

SIZES = [2**16, 2**18, 2**20, 2**22, 2**24]
CORES = os.cpu_count() or 1


def gloo_worker(out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        repeats = 20
        dist.barrier()
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - started) / repeats

    gather, scatter = {}, {}
    for size in SIZES:
        shard = torch.ones(size // 4 // world)
        whole = torch.ones(size // 4)
        gather[size] = timed(lambda: dist.all_gather_into_tensor(whole, shard))
        scatter[size] = timed(lambda: dist.reduce_scatter_tensor(shard, whole))
    # A tensor-parallel activation, [micro-batch 2, seq, dim], through DTensor and raw.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    activation = torch.ones(2, 64, 512)
    sharded = distribute_tensor(activation, mesh, [Shard(1)])
    partial = DTensor.from_local(activation, mesh, [Partial()])
    dtensor = (timed(lambda: sharded.redistribute(mesh, [Replicate()]))
               + timed(lambda: partial.redistribute(mesh, [Shard(1)]))) / 2
    flat_shard = torch.ones(activation.numel() // world)
    flat_whole = torch.ones(activation.numel())
    raw = (timed(lambda: dist.all_gather_into_tensor(flat_whole, flat_shard))
           + timed(lambda: dist.reduce_scatter_tensor(flat_shard, flat_whole))) / 2
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"gather": gather, "scatter": scatter,
                                         "dtensor": dtensor, "raw": raw}))
    dist.destroy_process_group()


def measure_gloo() -> tuple[float, float, float, float]:
    """Bandwidth (bytes/s) and latency (s) of a 2-rank all-gather, as the planner models it
    (t = bytes x (n-1)/n / bandwidth + latency x (n-1)); the reduce-scatter / all-gather time
    ratio at the larger sizes; DTensor's extra time per tensor-parallel collective."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "gloo.json")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", "29543", str(HERE), "--gloo-worker", str(out)],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        record = json.loads(out.read_text())
    times = {int(k): v for k, v in record["gather"].items()}
    scatter = {int(k): v for k, v in record["scatter"].items()}
    xs = [size * 0.5 for size in SIZES]
    ys = [times[size] for size in SIZES]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / \
        sum((x - mean_x) ** 2 for x in xs)
    latency = max(mean_y - slope * mean_x, 1e-6)
    for size in SIZES:
        print(f"  {size / 2**20:7.3f} MiB: all-gather {times[size] * 1e3:8.3f} ms, "
              f"reduce-scatter {scatter[size] * 1e3:8.3f} ms")
    factor = statistics.median(scatter[s] / times[s] for s in SIZES[2:])
    overhead = max(0.0, record["dtensor"] - record["raw"])
    print(f"  tensor-parallel activation: DTensor {record['dtensor'] * 1e3:.3f} ms, raw "
          f"{record['raw'] * 1e3:.3f} ms per collective")
    return 1 / slope, latency, factor, overhead


def measure_flops(steps: int) -> float:
    from raytrain.core.planner import ModelDims

    dims = ModelDims.from_gpt(MODEL["num_layers"], MODEL["dim"], MODEL["num_heads"],
                              4 * MODEL["dim"], MODEL["vocab_size"], SEQ, MODEL["max_seq_len"])
    result = run({"strategy": "data"}, 1, steps, global_batch=8, micro_batch=2, device="cpu")
    return dims.flops_per_token * 8 * SEQ / result["step_s"]


LAYOUTS = [
    (2, "data", {"strategy": "data"}),
    (2, "data + recompute", {"strategy": "data", "activation_checkpointing": True}),
    (2, "fsdp", {"strategy": "fsdp"}),
    (2, "tensor", {"strategy": "tensor"}),
    (2, "pipeline 1f1b", {"strategy": "pipeline"}),
    (2, "pipeline gpipe", {"strategy": "pipeline", "pipeline_schedule": "gpipe"}),
    (4, "data", {"strategy": "data"}),
    (4, "fsdp", {"strategy": "fsdp"}),
    (4, "dp2 x tp2", {"strategy": "hybrid", "dp_replicate": 2, "tp": 2}),
    (4, "pp2 x tp2", {"strategy": "hybrid", "pp": 2, "tp": 2}),
]


def validate(steps: int) -> None:
    from raytrain.spec import parse_job_spec

    from benchmarks.parallel_strategies import document

    print("\n| ranks | layout | predicted step s | measured step s | error | predicted MiB/rank "
          "| measured MiB/rank (max) | error |\n|---|---|---|---|---|---|---|---|")
    step_errors, memory_errors = [], []
    for ranks, name, parallel in LAYOUTS:
        job = document(parallel, ranks, steps, 8 * ranks, 2, "cpu")
        job["resources"]["cpus_per_worker"] = min(1.0, CORES / ranks)  # 4 ranks share 2 cores
        spec = parse_job_spec(job)
        predicted = spec.predicted()
        measured = run(parallel, ranks, steps, global_batch=8 * ranks, micro_batch=2,
                       device="cpu")
        step_error = predicted.step_s / measured["step_s"] - 1
        peak = max(measured["peak_bytes"])
        memory_error = predicted.memory_bytes / peak - 1
        step_errors.append(abs(step_error))
        memory_errors.append(abs(memory_error))
        print(f"| {ranks} | {name} | {predicted.step_s:.3f} | {measured['step_s']:.3f} | "
              f"{step_error:+.0%} | {predicted.memory_bytes / 2**20:.0f} | {peak / 2**20:.0f} | "
              f"{memory_error:+.0%} |", flush=True)
    print(f"\nstep time: median |error| {statistics.median(step_errors):.0%}, worst "
          f"{max(step_errors):.0%}; memory: median |error| {statistics.median(memory_errors):.0%},"
          f" worst {max(memory_errors):.0%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gloo-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gloo_worker:
        gloo_worker(args.gloo_worker)
        return
    bandwidth, latency, factor, overhead = measure_gloo()
    print(f"gloo, 2 processes: {bandwidth / 1e9:.2f} GB/s, latency {latency * 1e6:.0f} us, "
          f"reduce-scatter/all-gather {factor:.2f}, DTensor overhead {overhead * 1e6:.0f} us")
    flops = measure_flops(args.steps)
    print(f"one rank, one thread, fp32 training step: {flops / 1e9:.1f} GFLOP/s")
    if args.validate:
        validate(args.steps)


if __name__ == "__main__":
    main()
