"""FSDP2 with and without ZeRO-2 (`parallel.zero2`: parameters kept gathered from each
block's forward to its backward), side by side in one run, beside the planner's prediction
for each on this machine's node shape.

    python -m benchmarks.zero2 [--ranks 2] [--rounds 3] [--steps 8] [--microbatches 2]

raytrain's loop under torchrun (the strategies benchmark's worker and model: GPT dim 512 x 4
layers, vocab 8192, seq 64, fp32, gloo on CPU). The two alternate over `--rounds` so both see
the same machine; step time is the median of the rounds' medians. Peak memory is measured in
one more run of each with glibc returning freed blocks (live memory only: see
benchmarks/parallel_strategies.py), and predicted with the allocator's reserve left out.
"""

from __future__ import annotations

import argparse
import statistics

from benchmarks.parallel_strategies import MODEL, document, run

MICRO_BATCH = 2
MODES = {"FSDP2 (reshard after forward)": {"strategy": "fsdp"},
         "FSDP2 zero2": {"strategy": "fsdp", "zero2": True}}


def predicted(parallel: dict, ranks: int, global_batch: int) -> tuple[float, float]:
    """The planner's step seconds and memory per device (without the allocator's reserve)
    for this layout on this machine's node shape."""
    from raytrain.catalog.hardware import node_shape
    from raytrain.core.planner import evaluate
    from raytrain.core.resolve import job_layout, planner_inputs
    from raytrain.spec import JobSpec

    spec = JobSpec.model_validate(document(parallel, ranks, 2, global_batch, MICRO_BATCH,
                                           "cpu"))
    dims, work, _, _ = planner_inputs(spec)
    shape = node_shape("cpu")
    plan = evaluate(dims, work, job_layout(spec), shape)
    return plan.step_s, plan.memory_bytes - shape.gpu.runtime_reserve_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=2)
    args = parser.parse_args()
    global_batch = args.ranks * args.microbatches * MICRO_BATCH
    print(f"{args.ranks} ranks on cpu, GPT dim {MODEL['dim']} x {MODEL['num_layers']}, "
          f"{args.microbatches} micro-batches of {MICRO_BATCH} per rank per step, "
          f"{args.rounds} rounds alternating", flush=True)
    steps: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode, parallel in MODES.items():
            steps[mode].append(run(parallel, args.ranks, args.steps, global_batch, MICRO_BATCH,
                                   "cpu")["step_s"])
    peaks = {mode: max(run(parallel, args.ranks, 6, global_batch, MICRO_BATCH, "cpu",
                           live=True)["peak_bytes"]) for mode, parallel in MODES.items()}
    print("| layout | step s measured | predicted | peak MiB measured (live) | predicted |\n"
          "|---|---|---|---|---|")
    rows = {}
    for mode, parallel in MODES.items():
        step_s, memory = predicted(parallel, args.ranks, global_batch)
        rows[mode] = (statistics.median(steps[mode]), step_s, peaks[mode], memory)
        print(f"| {mode} | {rows[mode][0]:.4f} | {step_s:.4f} | {peaks[mode] / 2**20:.1f} | "
              f"{memory / 2**20:.1f} |", flush=True)
    (a, pa, ma, qa), (b, pb, mb, qb) = rows.values()
    print(f"zero2 / FSDP2: step time measured {b / a:.3f}, predicted {pb / pa:.3f}; "
          f"peak memory measured {mb / ma:.3f}, predicted {qb / qa:.3f}")


if __name__ == "__main__":
    main()
