"""Data-parallel throughput with gradient accumulation, gradients reduced once per optimizer
step against on every micro-batch, in one run.

    python -m benchmarks.grad_sync [--microbatches 4] [--rounds 3] [--steps 8] [--only NAME]

4 ranks, raytrain's loop under torchrun (the strategies benchmark's worker and model: GPT dim
512 x 4 layers, vocab 8192, seq 64, fp32, gloo on CPU or NCCL on GPU):
- across replicas, for HSDP (dp_replicate 2 x dp_shard 2) and data parallel beside tensor
  parallel (dp_replicate 2 x tp 2): "every micro-batch" is the loop with FSDP2's
  `set_requires_all_reduce` kept True, which is what it did before holding it back;
- within a replica, for FSDP (dp_shard 4): the reduce-scatter after every micro-batch (the
  default) against `parallel.reduce_scatter_once`.
The two alternate over `--rounds` so both see the same machine; the table gives each one's
median step time, tokens/s and the after/before ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # torchrun runs this file as a script

EVERY_MICRO_BATCH = "RAYTRAIN_BENCH_REDUCE_EVERY_MICRO_BATCH"
# name: (parallel section, what is reduced, the section for "once per step" or None for the
# same section with the all-reduce held back)
LAYOUTS = {
    "HSDP dp_replicate 2 x dp_shard 2": (
        {"strategy": "hybrid", "dp_replicate": 2, "dp_shard": 2}, "all-reduce across replicas",
        None),
    "dp_replicate 2 x tp 2": (
        {"strategy": "hybrid", "dp_replicate": 2, "tp": 2}, "all-reduce across replicas", None),
    "FSDP dp_shard 4": (
        {"strategy": "fsdp"}, "reduce-scatter",
        {"strategy": "fsdp", "reduce_scatter_once": True}),
}
RANKS = 4
MICRO_BATCH = 2


def worker(spec_path: str, out: str, device: str) -> None:
    """The strategies benchmark's worker; with EVERY_MICRO_BATCH set, FSDP2 all-reduces
    across replicas on every micro-batch whatever the loop asks."""
    from benchmarks.parallel_strategies import worker as train_and_record

    if os.environ.get(EVERY_MICRO_BATCH) == "1":
        from torch.distributed.fsdp import FSDPModule

        hold_back = FSDPModule.set_requires_all_reduce

        def always(self: FSDPModule, requires_all_reduce: bool, *, recurse: bool = True) -> None:
            hold_back(self, True, recurse=recurse)

        FSDPModule.set_requires_all_reduce = always  # type: ignore[method-assign]
    train_and_record(spec_path, out, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--only", choices=sorted(LAYOUTS), default=None)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    from benchmarks.parallel_strategies import MODEL, run

    print(f"{RANKS} ranks on {args.device}, GPT dim {MODEL['dim']} x {MODEL['num_layers']}, "
          f"{args.microbatches} micro-batches of {MICRO_BATCH} sequences per data-parallel "
          f"rank per step, {args.rounds} rounds alternating", flush=True)
    print("| layout | reduced | when | step s (median of rounds) | tokens/s | after / before |"
          "\n|---|---|---|---|---|---|")
    for name, (parallel, reduced, once_parallel) in LAYOUTS.items():
        if args.only and name != args.only:
            continue
        data_parallel = RANKS // parallel.get("tp", 1)
        global_batch = data_parallel * args.microbatches * MICRO_BATCH
        steps: dict[str, list[float]] = {"every micro-batch": [], "once per step": []}
        for _ in range(args.rounds):
            for mode in steps:
                held_back = mode == "once per step"
                os.environ[EVERY_MICRO_BATCH] = "0" if held_back or once_parallel else "1"
                section = once_parallel if (held_back and once_parallel) else parallel
                steps[mode].append(run(section, RANKS, args.steps, global_batch, MICRO_BATCH,
                                       args.device, script=HERE)["step_s"])
        before = statistics.median(steps["every micro-batch"])
        after = statistics.median(steps["once per step"])
        for mode, step_s in (("every micro-batch", before), ("once per step", after)):
            ratio = f"{before / step_s:.2f}x" if mode == "once per step" else ""
            print(f"| {name} | {reduced} | {mode} | {step_s:.4f} | "
                  f"{global_batch * MODEL['max_seq_len'] / step_s:,.0f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
