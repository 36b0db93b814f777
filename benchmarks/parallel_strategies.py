"""Parallel strategies side by side: throughput, pipeline bubble, peak memory per rank.

Every run is raytrain's own loop (raytrain.train.loop.train) under torchrun, gloo on CPU or
NCCL on GPU, one after another in the same invocation so their ratios share the machine's
state. Prints three tables:

1. Steady-state tokens/s of each strategy on the same ranks, against data parallel (DDP).
2. Pipeline bubble: for GPipe, 1F1B and interleaved 1F1B at several microbatch counts, the
   measured fraction 1 - (T_one / p) / T_pp, where T_one is one process's step time for the
   same global batch and T_pp the pipeline's (so it counts the bubble and the point-to-point
   traffic), next to the theory (p-1)/(m+p-1) and, interleaved, (p-1)/(v*m+p-1).
3. Peak memory per rank (CPU: peak RSS above the process's RSS before the model was built;
   GPU: torch.cuda.max_memory_allocated) next to the analytic expectation for weights,
   gradients and AdamW state (16 bytes per parameter held), activations excluded.

On CPU, glibc's allocator keeps freed blocks for reuse, so peak RSS also counts memory that
is no longer live (the CPU counterpart of the CUDA caching allocator's reserved memory).
`run(..., live=True)` makes it return every block of 128 KiB or more to the system when it is
freed (MALLOC_MMAP_THRESHOLD_), so peak RSS is the peak of what was live, the counterpart of
torch.cuda.max_memory_allocated; such runs are slower and their step time is not used.

    python -m benchmarks.parallel_strategies --ranks 2 [--device cuda] [--only throughput]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # torchrun runs this file as a script

MODEL = {"vocab_size": 8192, "dim": 512, "num_layers": 4, "num_heads": 8, "max_seq_len": 64}
SEQ = 64


def document(parallel: dict, ranks: int, steps: int, global_batch: int, micro_batch: int,
             device: str, model: dict | None = None) -> dict:
    model = model or MODEL
    return {
        "model": {"gpt": model},
        "data": {"seq_len": model["max_seq_len"]},
        "training": {"steps": steps, "global_batch_size": global_batch,
                     "micro_batch_size": micro_batch, "checkpoint_every_steps": 10_000,
                     "learning_rate": 1e-3},
        "parallel": parallel,
        "resources": {"num_workers": ranks, "gpus_per_worker": 1 if device == "cuda" else 0},
    }


# ------------------------------------------------------------------------------ worker side


def worker(spec_path: str, out: str, device_type: str) -> None:
    """Run under torchrun: train, then write this rank's step timestamps and peak memory."""
    write_record(out, *train_timed(spec_path, device_type))


def device_of(device_type: str, one_thread: bool = True) -> Any:
    """This rank's device under torchrun (LOCAL_RANK's GPU, or the CPU); `one_thread`: torch's
    CPU work on one thread (always on CPU, where the ranks share the cores)."""
    import torch

    if one_thread or device_type != "cuda":
        torch.set_num_threads(1)
    if device_type == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def train_timed(spec_path: str, device_type: str,
                after_step: Callable[[int], None] | None = None, one_thread: bool = True
                ) -> tuple[int, list[tuple[int, float, float]], Any, int]:
    """Run under torchrun: raytrain's loop on the job, one step short of its end (the final
    checkpoint would add its own buffers to the peak), each step reported. This rank, its
    (step, time done, data wait) points, its device and its RSS before the model was built;
    `after_step(step)` is called as each step is reported."""
    import torch.distributed as dist

    from raytrain.core.resolve import job_layout
    from raytrain.spec import JobSpec
    from raytrain.train.loop import train
    from raytrain.train.progress import NullSink
    from raytrain.train.rank import WorkerInfo

    spec = JobSpec.model_validate(json.loads(Path(spec_path).read_text()))
    world = int(os.environ.get("WORLD_SIZE", 1))
    device = device_of(device_type, one_thread)
    if world > 1:
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    rank = dist.get_rank() if world > 1 else 0
    rss_before = rss_bytes()

    class StepTimes(NullSink):
        def __init__(self) -> None:
            self.points: list[tuple[int, float, float]] = []

        def progress(self, payload: dict[str, Any]) -> None:
            self.points.append((payload["step"], time.perf_counter(),
                                payload.get("data_s") or 0.0))
            if after_step is not None:
                after_step(payload["step"])

    sink = StepTimes()
    with tempfile.TemporaryDirectory() as checkpoints:
        train(spec, WorkerInfo(rank, world, device), sink, Path(checkpoints),
              layout=job_layout(spec), stop_after_steps=spec.training.steps - 1,
              progress_interval_s=0.0)
    if world > 1:
        dist.destroy_process_group()
    return rank, sink.points, device, rss_before


def write_record(out: str, rank: int, points: list[tuple[int, float, float]], device: Any,
                 rss_before: int) -> None:
    """What `run` reads back from each rank: its (step, time, data wait) points and peak
    memory."""
    import torch

    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        reserved = torch.cuda.max_memory_reserved(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
        reserved = None
    record = {"rank": rank, "points": points, "peak_bytes": peak, "reserved_bytes": reserved}
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------------------ driver side


LIVE_MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}


def run(parallel: dict, ranks: int, steps: int, global_batch: int, micro_batch: int,
        device: str, model: dict | None = None, live: bool = False,
        spec: dict | None = None, script: Path = HERE, worker_args: tuple[str, ...] = ()
        ) -> dict[str, Any]:
    """One torchrun of the loop (one plain process for one rank); step time (median over
    steady steps) and peak memory (with `live`, of live memory only: see the module
    docstring). `spec`: the job document to run instead of `document(...)`'s; `script`:
    another worker with this one's `--worker` and record (benchmarks/gpu_truth.py's
    reference loop), given `worker_args` after them. Also returns rank 0's (step, time, ...)
    points and every rank's record as written."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp, "spec.json")
        spec_path.write_text(json.dumps(spec or document(
            parallel, ranks, steps, global_batch, micro_batch, device, model)))
        worker = [str(script), "--worker", str(spec_path), tmp, device, *worker_args]
        env = {**os.environ, "OMP_NUM_THREADS": "1", **(LIVE_MEMORY_ENV if live else {})}
        if ranks == 1:  # the same worker without torchrun's agent (a process importing torch)
            command = [sys.executable, *worker]
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT="29541")
        else:
            command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                       str(ranks), "--master_port", "29541", *worker]
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{script.name} exited {done.returncode}:\n"
                               + "\n".join(done.stderr.splitlines()[-30:]))
        records = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(ranks)]
    points = records[0]["points"]
    # Steady state: skip the first two steps (warm-up, lazy optimizer state).
    gaps = [b[1] - a[1] for a, b in zip(points[2:], points[3:])]
    step_s = statistics.median(gaps)
    return {"step_s": step_s,
            "tokens_per_s": global_batch * (model or MODEL)["max_seq_len"] / step_s,
            "peak_bytes": [r["peak_bytes"] for r in records],
            "reserved_bytes": [r["reserved_bytes"] for r in records], "points": points,
            "records": records}


def held_parameters(parallel: dict, ranks: int) -> int:
    """Parameters (with their gradient and AdamW state) the busiest rank holds, analytically."""
    from raytrain.core.planner import ModelDims, stage_params
    from raytrain.spec import parse_job_spec

    layout = parse_job_spec(document(parallel, ranks, 2, 8, 1, "cpu")).stated_layout()
    dims = ModelDims.from_gpt(MODEL["num_layers"], MODEL["dim"], MODEL["num_heads"],
                              4 * MODEL["dim"], MODEL["vocab_size"], MODEL["max_seq_len"],
                              MODEL["max_seq_len"])
    return stage_params(dims, layout.pp, layout.virtual_stages) // (layout.tp * layout.dp_shard)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", choices=["throughput", "bubble"], default=None)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    n = args.ranks
    print(f"model: GPT dim {MODEL['dim']} x {MODEL['num_layers']} layers, vocab "
          f"{MODEL['vocab_size']}, seq {SEQ}; {n} ranks on {args.device}; fp32, AdamW", flush=True)

    if args.only in (None, "throughput"):
        strategies = {
            "data (DDP)": {"strategy": "data"},
            "fsdp (FSDP2)": {"strategy": "fsdp"},
            "tensor (+ sequence parallel)": {"strategy": "tensor"},
            "pipeline (1F1B)": {"strategy": "pipeline"},
        }
        print("\n| strategy | step s | tokens/s | vs data | peak MiB per rank (measured) | "
              "weights+grads+AdamW MiB per rank (analytic) |\n|---|---|---|---|---|---|")
        baseline = None
        for name, parallel in strategies.items():
            result = run(parallel, n, args.steps, global_batch=8 * n, micro_batch=2,
                         device=args.device)
            baseline = baseline or result["tokens_per_s"]
            peaks = " / ".join(f"{b / 2**20:.0f}" for b in result["peak_bytes"])
            expected = 16 * held_parameters(parallel, n) / 2**20
            print(f"| {name} | {result['step_s']:.3f} | {result['tokens_per_s']:,.0f} | "
                  f"{result['tokens_per_s'] / baseline:.2f} | {peaks} | {expected:.0f} |",
                  flush=True)

    if args.only in (None, "bubble"):
        single = {}
        print("\n| schedule | microbatches m | step s | one process step s | measured bubble | "
              "theory |\n|---|---|---|---|---|---|")
        for m in (2, 4, 8):
            single[m] = run({"strategy": "data"}, 1, args.steps, global_batch=m, micro_batch=1,
                            device=args.device)["step_s"]
            for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
                if schedule != "gpipe" and m < n:
                    continue
                if schedule == "interleaved_1f1b" and m % n:
                    continue
                parallel = {"strategy": "pipeline", "pipeline_schedule": schedule,
                            "virtual_stages": v}
                step_s = run(parallel, n, args.steps, global_batch=m, micro_batch=1,
                             device=args.device)["step_s"]
                measured = 1 - (single[m] / n) / step_s
                theory = (n - 1) / (v * m + n - 1)
                print(f"| {schedule} | {m} | {step_s:.3f} | {single[m]:.3f} | {measured:.2f} | "
                      f"{theory:.2f} |", flush=True)


if __name__ == "__main__":
    main()
