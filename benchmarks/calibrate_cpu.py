"""The CPU device profile for the planner, and the planner's predictions against measurement.

1. Profile, from runs that are not validated: gloo's all-gather bandwidth and latency between
   two processes (a least-squares line through 64 KiB - 16 MiB) and its reduce-scatter cost
   against an all-gather; the FLOP/s of one rank (one thread) and its fixed cost per block,
   from one-process runs of the benchmark GPT and of a tiny GPT (two equations, two
   unknowns); the extra fixed cost of a tensor-parallel block and of an FSDP unit, from tiny
   2-rank runs; the runtime reserve (a rank's peak live memory beyond its tensors), from a tiny
   2-rank DDP run; with one process per core at once, the rate a rank writes into fresh
   buffers (FSDP2's copies) and its memory bandwidth under a fused AdamW step. Paste the
   printed figures into raytrain/catalog/hardware.py ("cpu", "gloo-local"); gloo is measured
   again between twice as many processes as cores ("gloo-local-shared", for ranks that share
   cores).
2. Validation (`--validate`): for ten layouts on 2 and 4 ranks, the planner's step time and
   memory per rank (with the profile just measured) against raytrain's loop under torchrun
   (benchmarks/parallel_strategies.py measures), each error and the median. Memory is judged
   on each layout's peak live memory (a second run whose allocator returns freed blocks to the
   system, the counterpart of torch.cuda.max_memory_allocated); the first run's peak RSS,
   which also holds blocks glibc keeps for reuse, is printed beside it.

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

from benchmarks.parallel_strategies import MODEL, run  # noqa: E402

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


def measure_gloo(ranks: int) -> tuple[float, float, float, float]:
    """Bandwidth (bytes/s) and latency (s) of an all-gather between `ranks` processes, as the
    planner models it (t = bytes x (n-1)/n / bandwidth + latency x (n-1)); the reduce-scatter
    / all-gather time ratio at the larger sizes; DTensor's extra time per tensor-parallel
    collective."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "gloo.json")
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                        str(ranks), "--master_port", "29543", str(HERE), "--gloo-worker",
                        str(out)],
                       check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        record = json.loads(out.read_text())
    times = {int(k): v for k, v in record["gather"].items()}
    scatter = {int(k): v for k, v in record["scatter"].items()}
    xs = [size * (ranks - 1) / ranks for size in SIZES]
    ys = [times[size] for size in SIZES]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / \
        sum((x - mean_x) ** 2 for x in xs)
    latency = max((mean_y - slope * mean_x) / (ranks - 1), 1e-6)
    for size in SIZES:
        print(f"  {size / 2**20:7.3f} MiB: all-gather {times[size] * 1e3:8.3f} ms, "
              f"reduce-scatter {scatter[size] * 1e3:8.3f} ms")
    factor = statistics.median(scatter[s] / times[s] for s in SIZES[2:])
    overhead = max(0.0, record["dtensor"] - record["raw"])
    print(f"  tensor-parallel activation: DTensor {record['dtensor'] * 1e3:.3f} ms, raw "
          f"{record['raw'] * 1e3:.3f} ms per collective")
    return 1 / slope, latency, factor, overhead


def copy_worker(out: str) -> None:
    """One rank's memory rates, while every core runs one: bytes written per second by a copy
    into a fresh 64 MiB buffer (what FSDP2 does around each collective; above glibc's 32 MiB
    ceiling for reusing freed memory, so every buffer is new pages), and the memory traffic
    per second of a fused AdamW step over the benchmark GPT's parameter count (28 bytes per
    parameter: parameter, gradient and two moments read, three of them written)."""
    import torch

    from benchmarks.parallel_strategies import MODEL
    from raytrain.models.gpt import GPT
    from raytrain.spec import GPTConfig

    torch.set_num_threads(1)
    source = torch.randn(16 * 2**20)

    def timed(fn, repeats: int) -> float:
        fn()
        started = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - started) / repeats

    staging = source.numel() * 4 / timed(lambda: torch.empty_like(source).copy_(source), 10)
    model = GPT(GPTConfig(**MODEL))
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    params = sum(p.numel() for p in model.parameters())
    memory = params * 28 / timed(optimizer.step, 10)
    Path(out).write_text(json.dumps({"staging": staging, "memory": memory}))


def measure_memory_rates() -> tuple[float, float]:
    """Staging (fresh-buffer copy) and memory bandwidth of one rank, bytes/s, the mean over
    one process per core run at once (ranks always share the machine)."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp, f"copy{i}.json") for i in range(CORES)]
        workers = [subprocess.Popen([sys.executable, str(HERE), "--copy-worker", str(out)],
                                    env={**os.environ, "OMP_NUM_THREADS": "1"})
                   for out in outs]
        for worker in workers:
            if worker.wait() != 0:
                sys.exit("a copy worker failed; run it alone to see why")
        records = [json.loads(out.read_text()) for out in outs]
    return (statistics.fmean(r["staging"] for r in records),
            statistics.fmean(r["memory"] for r in records))


TINY = {"vocab_size": 64, "dim": 64, "num_layers": 4, "num_heads": 4, "max_seq_len": 16}


def _prediction(parallel: dict, ranks: int, model: dict, steps: int):
    from benchmarks.parallel_strategies import document
    from raytrain.core.resolve import job_layout, predicted
    from raytrain.spec import parse_job_spec

    job = document(parallel, ranks, steps, 8 * ranks, 2, "cpu", model)
    spec = parse_job_spec(job)
    return predicted(spec, job_layout(spec), _catalog())


_MEASURED: dict[str, object] = {}  # what this run measured: the `cpu` kind's figures, links


def _catalog():
    """The shipped catalog with what this run has measured so far (a new Catalog value)."""
    import dataclasses
    from types import MappingProxyType

    from raytrain.catalog.hardware import CATALOG, Catalog

    links = {**CATALOG.links, **{k: v for k, v in _MEASURED.items() if k != "cpu"}}
    cpu = _MEASURED.get("cpu", CATALOG.gpus["cpu"])
    local = links["gloo-local"]
    shape = dataclasses.replace(CATALOG.shapes["cpu-local"], gpu=cpu, intra=local, inter=local)
    return Catalog(MappingProxyType({**CATALOG.gpus, "cpu": cpu}),
                   MappingProxyType({**CATALOG.shapes, "cpu-local": shape}),
                   MappingProxyType(links))


def _set_link(name: str, bandwidth: float, latency: float, factor: float) -> None:
    """Predict with a gloo link just measured (`gloo-local`: the CPU node shape's own)."""
    import dataclasses

    _MEASURED[name] = dataclasses.replace(_catalog().links[name], bandwidth=bandwidth,
                                          latency_s=latency, reduce_scatter_factor=factor)


def _set_cpu(**figures: float) -> None:
    import dataclasses

    _MEASURED["cpu"] = dataclasses.replace(_catalog().gpus["cpu"], **figures)


def measure_compute(steps: int) -> dict[str, float]:
    """FLOP/s and fixed costs of one CPU rank, from runs of the benchmark GPT and of a tiny
    one (whose step is almost all fixed cost): one process each, then a tiny tensor-parallel
    and a tiny FSDP run on 2 ranks, each read against the planner's prediction without the
    fixed cost it isolates; the runtime reserve is a tiny 2-rank DDP run's peak live memory
    above its tensors. Nothing here uses the validation runs."""
    from raytrain.core.planner import ModelDims

    def dims(model: dict) -> ModelDims:
        return ModelDims.from_gpt(model["num_layers"], model["dim"], model["num_heads"],
                                  4 * model["dim"], model["vocab_size"], model["max_seq_len"],
                                  model["max_seq_len"])

    def flops(model: dict) -> float:
        return dims(model).flops_per_token * 8 * model["max_seq_len"]

    def optimizer_s(model: dict) -> float:
        return dims(model).params * 28 / _catalog().gpus["cpu"].memory_bandwidth

    big = run({"strategy": "data"}, 1, steps, 8, 2, "cpu")["step_s"] - optimizer_s(MODEL)
    tiny = run({"strategy": "data"}, 1, steps, 8, 2, "cpu", TINY)["step_s"] - optimizer_s(TINY)
    passes = 4 * TINY["num_layers"]  # 4 microbatches x layers
    peak, block = flops(MODEL) / big, 0.0
    for _ in range(5):  # two equations, two unknowns; converges in a few rounds
        block = max(0.0, (tiny - flops(TINY) / peak) / passes)
        peak = flops(MODEL) / (big - 4 * MODEL["num_layers"] * block)
    _set_cpu(fp32_flops=peak, bf16_flops=peak, block_overhead_s=block, tp_block_overhead_s=0.0,
             fsdp_unit_overhead_s=0.0, runtime_reserve_bytes=0.0)
    figures = {"fp32_flops": peak, "block_overhead_s": block}
    ddp = run({"strategy": "data"}, 2, steps, 16, 2, "cpu", TINY, live=True)
    tensors = _prediction({"strategy": "data"}, 2, TINY, steps).memory_bytes
    figures["runtime_reserve_bytes"] = max(0.0, max(ddp["peak_bytes"]) - tensors)
    print(f"  tiny data: peak live memory {max(ddp['peak_bytes']) / 2**20:.1f} MiB, tensors "
          f"{tensors / 2**20:.1f} MiB")
    for name, parallel, per in (("tp_block_overhead_s", {"strategy": "tensor"},
                                 8 * TINY["num_layers"]),
                                ("fsdp_unit_overhead_s", {"strategy": "fsdp"},
                                 4 * (TINY["num_layers"] + 1))):
        measured = run(parallel, 2, steps, 16, 2, "cpu", TINY)["step_s"]
        predicted = _prediction(parallel, 2, TINY, steps).step_s
        figures[name] = max(0.0, (measured - predicted) / per)
        print(f"  tiny {parallel['strategy']}: measured {measured:.4f} s, predicted without "
              f"its fixed cost {predicted:.4f} s")
    # The validation below predicts with what was just measured.
    _set_cpu(**{k: v for k, v in figures.items() if k.endswith(("overhead_s", "_bytes"))})
    return figures


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
    """Each layout twice: a plain run for step time (and peak RSS), a live-memory run for the
    memory the planner predicts."""
    from benchmarks.parallel_strategies import document
    from raytrain.core.resolve import job_layout
    from raytrain.core.resolve import predicted as _predicted
    from raytrain.spec import parse_job_spec

    print("\n| ranks | layout | predicted step s | measured step s | error | predicted MiB/rank "
          "| measured live MiB/rank (max) | error | peak RSS MiB/rank (max) |"
          "\n|---|---|---|---|---|---|---|---|---|")
    step_errors, memory_errors = [], []
    for ranks, name, parallel in LAYOUTS:
        job = document(parallel, ranks, steps, 8 * ranks, 2, "cpu")
        job["resources"]["cpus_per_worker"] = min(1.0, CORES / ranks)  # 4 ranks share 2 cores
        spec = parse_job_spec(job)
        predicted = _predicted(spec, job_layout(spec), _catalog())
        measured = run(parallel, ranks, steps, global_batch=8 * ranks, micro_batch=2,
                       device="cpu")
        live = run(parallel, ranks, steps, global_batch=8 * ranks, micro_batch=2,
                   device="cpu", live=True)
        step_error = predicted.step_s / measured["step_s"] - 1
        peak = max(live["peak_bytes"])
        memory_error = predicted.memory_bytes / peak - 1
        step_errors.append(abs(step_error))
        memory_errors.append(abs(memory_error))
        print(f"| {ranks} | {name} | {predicted.step_s:.3f} | {measured['step_s']:.3f} | "
              f"{step_error:+.0%} | {predicted.memory_bytes / 2**20:.0f} | {peak / 2**20:.0f} | "
              f"{memory_error:+.0%} | {max(measured['peak_bytes']) / 2**20:.0f} |", flush=True)
    print(f"\nstep time: median |error| {statistics.median(step_errors):.0%}, worst "
          f"{max(step_errors):.0%}; memory: median |error| {statistics.median(memory_errors):.0%},"
          f" worst {max(memory_errors):.0%}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gloo-worker", help=argparse.SUPPRESS)
    parser.add_argument("--copy-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gloo_worker:
        gloo_worker(args.gloo_worker)
        return
    if args.copy_worker:
        copy_worker(args.copy_worker)
        return
    staging, memory = measure_memory_rates()
    print(f"one rank, every core busy: {memory / 1e9:.1f} GB/s of fused AdamW traffic, "
          f"{staging / 1e9:.2f} GB/s written into fresh buffers")
    _set_cpu(memory_bandwidth=memory, staging_bandwidth=staging)
    for ranks, link in ((2, "gloo-local"), (2 * CORES, "gloo-local-shared")):
        bandwidth, latency, factor, overhead = measure_gloo(ranks)
        print(f"gloo, {ranks} processes ({link}): {bandwidth / 1e9:.2f} GB/s, latency "
              f"{latency * 1e6:.0f} us, reduce-scatter/all-gather {factor:.2f}, DTensor "
              f"overhead {overhead * 1e6:.0f} us")
        _set_link(link, bandwidth, latency, factor)
    figures = measure_compute(args.steps)
    print(f"one rank, one thread, fp32: {figures['fp32_flops'] / 1e9:.1f} GFLOP/s; fixed "
          f"costs per microbatch: block {figures['block_overhead_s'] * 1e3:.2f} ms, "
          f"tensor-parallel block +{figures['tp_block_overhead_s'] * 1e3:.2f} ms, "
          f"FSDP unit +{figures['fsdp_unit_overhead_s'] * 1e3:.2f} ms; runtime reserve "
          f"{figures['runtime_reserve_bytes'] / 2**20:.0f} MiB per rank")
    if args.validate:
        validate(args.steps)


if __name__ == "__main__":
    main()
