"""The planner against published large-scale runs (benchmarks/published_runs.yaml): the
kernel constants fitted on the runs marked `fit`, and the errors on both sets, printed side by
side. tests/pure/test_planner.py asserts the validation targets on the same runs.

    python -m benchmarks.planner_published           # the table with the catalog's constants
    python -m benchmarks.planner_published --fit     # refit, then the table with the fit
    python -m benchmarks.planner_published --defaults  # each run under raytrain's defaults

It also times planning a 1.2T-parameter model on 3,072 H100s (asserted under 2 s).

The fit: a grid search over the four fitted constants of raytrain.core.kernels.KernelModel
(flash_vs_gemm is FlashAttention-2's published figure, not fitted) and the matmul rate of the
one machine whose rate is not published (torchtitan's 500 W H100s), minimising the sum of
squared log errors of tokens/s per GPU over the fit runs. The validation runs play no part.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from dataclasses import replace

from benchmarks.published_runs import PublishedRun, published_runs
from raytrain.catalog.hardware import GiB
from raytrain.core.kernels import KERNELS, KernelModel
from raytrain.core.planner import ModelDims, Plan, Workload, evaluate, plan

ONE_T = ModelDims(128, 25600, 160, 102400, 128256, 4096, num_kv_heads=16, gated_mlp=True)

GRID = {
    "sustained": [0.60 + 0.02 * i for i in range(21)],
    "softmax_passes": [2.0 * i for i in range(0, 16)],
    "fused_elementwise_passes": [2.0 * i for i in range(0, 16)],
    "elementwise_passes": [4.0 * i for i in range(0, 21)],
    "gemm_efficiency": [0.40 + 0.02 * i for i in range(0, 26)],
}


def predicted_per_gpu(run: PublishedRun, kernels: KernelModel = KERNELS,
                      gemm_efficiency: float | None = None) -> tuple[float, float]:
    """(tokens/s per GPU, peak memory GiB) the planner predicts for a run's own layout;
    `gemm_efficiency` replaces the shape's where the run's is fitted."""
    shape = run.shape
    if gemm_efficiency is not None and run.fitted_gpu:
        shape = replace(shape, gpu=replace(shape.gpu, gemm_efficiency=gemm_efficiency))
    plan = evaluate(run.dims, replace(run.work, kernels=kernels), run.layout, shape)
    return plan.tokens_per_s / run.layout.world_size, plan.memory_bytes / GiB


def log_error(run: PublishedRun, kernels: KernelModel,
              gemm_efficiency: float | None = None) -> float:
    return math.log(predicted_per_gpu(run, kernels, gemm_efficiency)[0]
                    / run.tokens_per_s_per_gpu)


def fit(runs: list[PublishedRun]) -> tuple[KernelModel, float]:
    """The grid point with the least squared log error over `runs`, and the matmul rate of
    the runs whose GPU's is fitted. For each value of the fused kernels' passes (which both
    sets share), the runs on catalog GPUs fix sustained and the softmax passes, and the runs
    on the fitted GPU its matmul rate and the eager passes: nested grids, not their product."""
    catalog = [r for r in runs if not r.fitted_gpu]
    fitted = [r for r in runs if r.fitted_gpu]

    def loss(among: list[PublishedRun], kernels: KernelModel, rate: float | None) -> float:
        return sum(log_error(r, kernels, rate) ** 2 for r in among)

    best = None
    for fused in GRID["fused_elementwise_passes"]:
        base = replace(KERNELS, fused_elementwise_passes=fused)
        first = min((replace(base, sustained=s, softmax_passes=m)
                     for s, m in itertools.product(GRID["sustained"], GRID["softmax_passes"])),
                    key=lambda k: loss(catalog, k, None))
        kernels, rate = min(((replace(first, elementwise_passes=e), g) for e, g in
                             itertools.product(GRID["elementwise_passes"],
                                               GRID["gemm_efficiency"])),
                            key=lambda kg: loss(fitted, *kg))
        total = loss(catalog, kernels, None) + loss(fitted, kernels, rate)
        if best is None or total < best[0]:
            best = (total, kernels, rate)
    return best[1], best[2]


def under_defaults(run: PublishedRun) -> PublishedRun:
    """A run as raytrain would plan it knowing nothing of its framework: flash attention,
    eager kernels, fp32 gradient reduction, sequence parallelism, no compile or Float8 gain."""
    work = Workload(global_batch=run.work.global_batch,
                    recompute_options=run.work.recompute_options,
                    loss_parallel=run.work.loss_parallel)
    return replace(run, work=work, layout=replace(run.layout, sequence_parallel=True))


def time_one_trillion() -> tuple[float, Plan]:
    started = time.perf_counter()
    plans = plan(ONE_T, Workload(global_batch=1536), "h100-sxm", 3072, usd_per_device_hour=2.0)
    return time.perf_counter() - started, plans[0]


def errors(kernels: KernelModel, role: str, rate: float | None = None,
           runs: list[PublishedRun] | None = None) -> list[float]:
    """Predicted over published tokens/s per GPU, less 1, for the runs of `role`."""
    return [math.exp(log_error(r, kernels, rate)) - 1
            for r in (published_runs() if runs is None else runs) if r.role == role]


GROUPS = {  # name: which runs belong (a run may be in more than one parallelism group)
    "one node": lambda r: r.layout.world_size <= r.shape.gpus_per_node,
    "many nodes": lambda r: r.layout.world_size > r.shape.gpus_per_node,
    "A100": lambda r: r.shape.gpu.name.startswith("a100"),
    "H100": lambda r: r.shape.gpu.name.startswith("h100"),
    "FSDP": lambda r: r.layout.dp_shard > 1,
    "tensor or pipeline parallel": lambda r: r.layout.tp > 1 or r.layout.pp > 1,
    "data parallel only": lambda r: r.layout.tp == r.layout.pp == 1,
    "no recomputation": lambda r: r.layout.recompute == "none",
    "selective recomputation": lambda r: r.layout.recompute == "selective",
    "full recomputation": lambda r: r.layout.recompute == "full",
}


def print_groups(runs: list[PublishedRun], kernels: KernelModel, rate: float | None) -> None:
    """Tokens/s errors by kind of run, all runs and the held-out ones."""
    print("\n| group | runs | median abs. error | worst | held out | median | worst |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    error = {r.name: abs(math.exp(log_error(r, kernels, rate)) - 1) for r in runs}
    for name, member in GROUPS.items():
        cells = []
        for among in ([r for r in runs if member(r)],
                      [r for r in runs if member(r) and r.role == "validate"]):
            found = [error[r.name] for r in among]
            cells.append(f"{len(found)} | {statistics.median(found):.1%} | {max(found):.1%}"
                         if found else "0 | | ")
        print(f"| {name} | {' | '.join(cells)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="refit the kernel constants first")
    parser.add_argument("--defaults", action="store_true",
                        help="plan each run with raytrain's defaults, not its framework's")
    args = parser.parse_args()
    runs = [under_defaults(r) if args.defaults else r for r in published_runs()]
    kernels, rate = fit([r for r in runs if r.role == "fit"]) if args.fit else (KERNELS, None)
    print(f"kernel constants ({'fitted now' if args.fit else 'the catalog'}): {kernels}")
    if rate is not None:
        print(f"matmul rate of the fitted GPU (published_runs.yaml's gemm_efficiency): {rate:.2f}")
    print()
    print("| run | role | layout | published tokens/s/GPU | predicted | error | "
          "published GiB | predicted GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for run in runs:
        per_gpu, memory = predicted_per_gpu(run, kernels, rate)
        published_memory = "" if run.memory_gib is None else f"{run.memory_gib}"
        print(f"| {run.name} | {run.role} | {run.layout.describe()} | "
              f"{run.tokens_per_s_per_gpu:,.1f} | {per_gpu:,.1f} | "
              f"{per_gpu / run.tokens_per_s_per_gpu - 1:+.1%} | {published_memory} | "
              f"{memory:.1f} |")
    for role in ("fit", "validate"):
        found = [abs(e) for e in errors(kernels, role, rate, runs)]
        print(f"\n{role}: {len(found)} runs, median |error| {statistics.median(found):.1%}, "
              f"worst {max(found):.1%}")
    print_groups(runs, kernels, rate)
    times = []
    for _ in range(3):
        seconds, best = time_one_trillion()
        times.append(seconds)
    print(f"\n{ONE_T.params / 1e12:.2f}T parameters on 3,072 H100s: planned in "
          f"{', '.join(f'{t:.2f}' for t in times)} s; best: {best.reason}")


if __name__ == "__main__":
    main()
