"""Replay the shipped spot-fleet traces against one job under every way of buying capacity,
with and without the cloud's preemption notice; print the tables, each strategy's regret
against on-demand from the same start, and the policy's gap to the oracle; save a plot when
matplotlib is installed (`pip install -e '.[bench]'`).

    python -m benchmarks.spot_simulation [--starts 44] [--processes 2] [--plot PATH]

The policy and the baselines that are policies (on-demand, spot with a fixed 30-minute
interval, failover) run through the live service (raytrain.sim.replay): its job manager,
scheduler, provisioner, capacity engine, lifecycle and bill, with the service's own settings.
Uniform Progress and the hindsight-optimal schedule are computed beside them under the same
cloud figures.

The job: a data-parallel GPT-2 small on 8 nodes, 6 hours of training there by the planner,
a 12-hour deadline. The cloud: nodes up 120 s after they are asked for, a group's start 30 s,
a checkpoint 60 s (the service measures all three as it goes). Prices are the catalog's for
the trace's instance type; the GCP traces are priced as p3.2xlarge (the catalog has no GCP
offers) with GCP's 30 s notice. Parcae's p3 fleet is Bamboo's p3 trace again, so it is not
replayed as a second result.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Iterator

from raytrain.catalog.traces import load_trace
from raytrain.core.simulate import STRATEGIES, Summary
from raytrain.sim.replay import Market
from raytrain.sim.simulation import (
    NO_NOTICE,
    TraceJob,
    finite_hours,
    repaired_late_runs,
    simulate_trace,
)
from raytrain.spec import PolicySpec
from raytrain.spec.files import TRACES_DIR, load_policies, snapshot

RUNS = [  # trace file, the offer its fleet is priced as, its cloud's notice (seconds, share)
    ("bamboo/p3-trace.csv", "p3.2xlarge", None),
    ("bamboo/g4dn-trace.csv", "g4dn.xlarge", None),
    ("bamboo/a100x1-east1b.txt", "p3.2xlarge", (30.0, 0.9)),
    ("bamboo/v100x1-east1c.txt", "p3.2xlarge", (30.0, 0.9)),
]


def the_job(trace_file: str, instance: str, notice: tuple[float, float] | None,
            **changes: object) -> TraceJob:
    """The job of every table (module doc) on the trace, priced as `instance`."""
    offer = next(o for o in snapshot().offers if o.instance_type == instance)
    return TraceJob(load_trace(TRACES_DIR / trace_file), offer, nodes=8, work_s=6 * 3600,
                    deadline_s=12 * 3600, notice=notice, **changes)  # type: ignore[arg-type]


def each_run(with_notice: bool) -> Iterator[TraceJob]:
    for trace_file, instance, notice in RUNS:
        yield the_job(trace_file, instance, notice if with_notice else NO_NOTICE)


def table(rows: list[Summary]) -> list[str]:
    lines = ["| trace | notice s | strategy | mean $ | mean cost / on-demand's | worst | "
             "mean h | deadline misses | preemptions | work lost h |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mean = "-" if r.mean_regret is None else f"{1 + r.mean_regret:.3f}"
        worst = "-" if r.worst_regret is None else f"{1 + r.worst_regret:.3f}"
        lines.append(f"| {r.trace} | {r.notice_s:g} | {r.strategy} | {r.mean_cost_usd:.2f} | "
                     f"{mean} | {worst} | {r.mean_hours:.2f} | {r.deadline_misses}/{r.runs} | "
                     f"{r.mean_preemptions:.1f} | {r.mean_lost_work_hours:.2f} |")
    return lines


def gaps(rows: list[Summary]) -> list[str]:
    """The policy against Uniform Progress and the oracle, per trace and notice."""
    lines = []
    for key in dict.fromkeys((r.trace, r.notice_s) for r in rows):
        by = {r.strategy: r for r in rows if (r.trace, r.notice_s) == key}
        policy, oracle, up = by["policy"], by["oracle"], by["uniform-progress"]
        lines.append(
            f"- {key[0]}, notice {key[1]:g} s: policy ${policy.mean_cost_usd:.2f} "
            f"({policy.deadline_misses} late, worst {1 + (policy.worst_regret or 0):.3f} x "
            f"on-demand), {1 - policy.mean_cost_usd / by['on-demand'].mean_cost_usd:.0%} off "
            f"on-demand; {policy.mean_cost_usd / up.mean_cost_usd - 1:+.1%} against Uniform "
            f"Progress (${up.mean_cost_usd:.2f}, {up.deadline_misses} late, worst "
            f"{1 + (up.worst_regret or 0):.3f}); "
            f"{policy.mean_cost_usd / oracle.mean_cost_usd - 1:+.1%} against the oracle "
            f"(${oracle.mean_cost_usd:.2f})")
    return lines


def two_fleets(policy: PolicySpec, starts: int, processes: int) -> list[Summary]:
    """The policy choosing between fleets with different traces: p3.2xlarge in us-east-1 on
    Bamboo's churning p3 fleet, or the same type and price in a second region whose fleet is
    the calmer GCP V100 trace. Only the policy knows of the second fleet; the oracle is the
    first fleet's."""
    p3 = snapshot().find("aws/us-east-1/p3.2xlarge")
    west = p3.model_copy(update={"region": "us-west-2"})
    calm = load_trace(TRACES_DIR / "bamboo/v100x1-east1c.txt")
    rows = []
    for notice in (NO_NOTICE, None):
        job = the_job("bamboo/p3-trace.csv", "p3.2xlarge", notice,
                      alternatives=(Market(west, "spot", calm),))
        rows += simulate_trace(job, policy, starts, processes=processes)
    return rows


def late_repairs(policy: PolicySpec, starts: int) -> list[str]:
    lines = []
    for with_notice in (False, True):
        for job in each_run(with_notice):
            for start, late, punctual in repaired_late_runs(job, policy, starts):
                lines.append(
                    f"- {job.trace.name}, notice {job.notice_s:g} s, start {start / 3600:.1f} h:"
                    f" Uniform Progress ${late.cost_usd:.2f}, done at "
                    f"{finite_hours(late.finished_s)} h (late); made punctual with hindsight "
                    + (f"${punctual.cost_usd:.2f}" if punctual else "impossible"))
    return lines


def plot(tables: dict[str, list[Summary]], path: Path) -> str:
    try:
        import matplotlib
    except ImportError:
        return ("no plot: matplotlib is not installed (pip install -e '.[bench]' installs "
                "it)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    traces = list(dict.fromkeys(r.trace for r in next(iter(tables.values()))))
    fig, axes = plt.subplots(len(tables), 2, figsize=(13, 4.2 * len(tables)), squeeze=False)
    width = 0.8 / len(STRATEGIES)
    for row, (title, rows) in enumerate(tables.items()):
        for col, (field, label) in enumerate((("mean_cost_usd", "mean cost, $"),
                                              ("mean_hours", "mean hours to finish"))):
            ax = axes[row][col]
            for i, strategy in enumerate(STRATEGIES):
                values = [next(getattr(r, field) for r in rows
                               if r.trace == t and r.strategy == strategy) for t in traces]
                ax.bar([x + i * width for x in range(len(traces))], values, width,
                       label=strategy)
            if field == "mean_hours":
                ax.axhline(12, color="grey", linestyle="--", linewidth=1)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(traces))], traces,
                          fontsize=8)
            ax.set_title(f"{title}: {label}", fontsize=10)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return f"plot: {path}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path,
                        default=Path(__file__).resolve().parent / "figures" / "spot_simulation.png")
    parser.add_argument("--policy", default="cost-first")
    parser.add_argument("--starts", type=int, default=44)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--skip-extras", action="store_true",
                        help="only the two main tables")
    args = parser.parse_args()
    policy = load_policies()[args.policy]
    tables = {}
    for with_notice in (False, True):
        began = time.perf_counter()
        rows = [row for job in each_run(with_notice)
                for row in simulate_trace(job, policy, args.starts, processes=args.processes)]
        title = "with the cloud's notice (AWS 120 s, GCP 30 s, each to 90%)" if with_notice \
            else "no notice"
        tables[title] = rows
        print(f"\n## {title} (policy {args.policy}, {args.starts} starts; "
              f"{time.perf_counter() - began:.0f} s)")
        print("\n".join(table(rows)))
        print()
        print("\n".join(gaps(rows)))
    if not args.skip_extras:
        began = time.perf_counter()
        rows = two_fleets(policy, args.starts, args.processes)
        print(f"\n## 8 x p3.2xlarge on the p3 fleet, or on a calm fleet in another region "
              f"({time.perf_counter() - began:.0f} s)")
        print("\n".join(table(rows)))
        began = time.perf_counter()
        repairs = late_repairs(policy, args.starts)
        print(f"\n## Uniform Progress's late runs, made punctual with hindsight "
              f"({time.perf_counter() - began:.0f} s)")
        print("\n".join(repairs) or "none late")
    print("\n" + plot(tables, args.plot))


if __name__ == "__main__":
    main()
