"""Replay the shipped spot-fleet traces against one job under every way of buying capacity
(on-demand only, spot with restart from checkpoint, failover to on-demand, Can't Be Late's
Uniform Progress, the policy, and the hindsight-optimal schedule), with and without a
preemption notice the job can checkpoint on; print the tables, the policy's gaps, and save a
plot.

    python -m benchmarks.spot_simulation [--plot benchmarks/figures/spot_simulation.png]

The job: 8 nodes, 6 hours of training, a 12-hour deadline, checkpoints cost 60 s, a restart
on new capacity 300 s; `spot` and `failover` checkpoint every 30 minutes; 11 start times
spread over each trace. Prices are the catalog's for the trace's instance type; the GCP
traces are priced as p3.2xlarge (the catalog has no GCP offers) and their notice is GCP's 30 s,
the AWS traces' is AWS's up to 120 s. Parcae's p3 fleet is Bamboo's p3 trace again (its 163
timestamps all match), so it is not replayed as a second result.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Iterator

from raytrain.catalog.files import TRACES_DIR, load_policies, snapshot
from raytrain.catalog.traces import load_trace
from raytrain.core.fleet import Fleet, Trace
from raytrain.core.simulate import STRATEGIES, SimJob, Summary, compare, simulate
from raytrain.spec import Offer

TRACES = TRACES_DIR
RUNS = [  # trace file, the offer its fleet is priced as, the notice its cloud gives
    ("bamboo/p3-trace.csv", "p3.2xlarge", 120.0),
    ("bamboo/g4dn-trace.csv", "g4dn.xlarge", 120.0),
    ("bamboo/a100x1-east1b.txt", "p3.2xlarge", 30.0),
    ("bamboo/v100x1-east1c.txt", "p3.2xlarge", 30.0),
]


def the_job(offer: Offer, notice_s: float, alternatives: tuple[Fleet, ...] = ()) -> SimJob:
    """The job of every table (module doc) on `offer`."""
    return SimJob(offer=offer, nodes=8, work_s=6 * 3600, deadline_s=12 * 3600,
                  fixed_interval_s=1800, notice_s=notice_s, alternatives=alternatives)


def each_run(with_notice: bool) -> Iterator[tuple[Trace, SimJob]]:
    """Every shipped trace with its job, with or without its cloud's notice."""
    catalog = snapshot()
    for trace_file, instance, notice in RUNS:
        offer = next(o for o in catalog.offers if o.instance_type == instance)
        yield load_trace(TRACES / trace_file), the_job(offer, notice if with_notice else 0.0)


def run(with_notice: bool, policy_name: str, starts: int) -> list[Summary]:
    policy = load_policies()[policy_name]
    return [row for trace, job in each_run(with_notice)
            for row in compare(trace, job, policy, starts)]


def late_repairs(policy_name: str, starts: int, every_s: float = 120.0) -> list[str]:
    """Each run Uniform Progress finishes late, made punctual with hindsight: the same run
    moved to on-demand to the end at the one moment (tried every `every_s`) that finishes in
    time for the least; beside the policy's cost on that run, and both means over the trace's
    runs. What the policy pays above Uniform Progress there is the deadline's price, not its
    spot buying's."""
    policy = load_policies()[policy_name]
    lines = []
    for with_notice in (False, True):
        for trace, job in each_run(with_notice):
            punctual, ours, before = [], [], len(lines)
            for start in (trace.duration_s * i / starts for i in range(starts)):
                up = simulate(trace, job, "uniform-progress", policy, start)
                ours.append(simulate(trace, job, "policy", policy, start).cost_usd)
                if up.met_deadline:
                    punctual.append(up.cost_usd)
                    continue
                repaired = min((r for s in range(0, int(job.deadline_s), int(every_s))
                                if (r := simulate(trace, job, "uniform-progress", policy, start,
                                                  on_demand_from_s=float(s))).met_deadline),
                               key=lambda r: r.cost_usd, default=None)
                punctual.append(repaired.cost_usd if repaired else float("inf"))
                lines.append(
                    f"- {trace.name}, notice {job.notice_s:.0f} s, start {start / 3600:.1f} h: "
                    f"Uniform Progress ${up.cost_usd:.2f}, done at {up.finished_s / 3600:.2f} h "
                    "(late); made punctual with hindsight "
                    + (f"${repaired.cost_usd:.2f} ({repaired.on_demand_s / 3600:.2f} h on "
                       "demand)" if repaired else "impossible")
                    + f"; the policy ${ours[-1]:.2f}")
            if len(lines) > before:  # some run was late
                lines.append(f"  - {trace.name}, notice {job.notice_s:.0f} s, mean over the "
                             f"{starts} runs: Uniform Progress made punctual "
                             f"${sum(punctual) / starts:.2f}, the policy "
                             f"${sum(ours) / starts:.2f}")
    return lines


def cost_split(policy_name: str, starts: int) -> list[str]:
    """What the policy's bill paid for on each trace (SimResult.cost_by_phase), the mean over
    the start times: training, restarts, checkpoints, waiting for the rest of a group."""
    policy = load_policies()[policy_name]
    lines = []
    for with_notice in (False, True):
        for trace, job in each_run(with_notice):
            results = [simulate(trace, job, "policy", policy, trace.duration_s * i / starts)
                       for i in range(starts)]
            phases = {phase: sum(r.cost_by_phase.get(phase, 0.0) for r in results) / starts
                      for phase in ("training", "restarting", "checkpointing", "waiting")}
            lines.append(f"- {trace.name}, notice {job.notice_s:.0f} s: "
                         + ", ".join(f"{phase} ${usd:.2f}" for phase, usd in phases.items()))
    return lines


def gaps(rows: list[Summary]) -> list[str]:
    """The policy against Uniform Progress and the oracle, and its saving, per trace."""
    lines = []
    for trace in dict.fromkeys(r.trace for r in rows):
        by = {r.strategy: r for r in rows if r.trace == trace}
        policy, oracle = by["policy"], by["oracle"]
        lines.append(
            f"- {trace}: policy ${policy.mean_cost_usd:.2f} ({policy.deadline_misses} late), "
            f"{1 - policy.mean_cost_usd / by['on-demand'].mean_cost_usd:.0%} off on-demand; "
            f"{policy.mean_cost_usd / by['uniform-progress'].mean_cost_usd - 1:+.1%} against "
            f"Uniform Progress (${by['uniform-progress'].mean_cost_usd:.2f}, "
            f"{by['uniform-progress'].deadline_misses} late); "
            f"{policy.mean_cost_usd / oracle.mean_cost_usd - 1:+.1%} against the oracle "
            f"(${oracle.mean_cost_usd:.2f})")
    return lines


def two_fleets(policy_name: str, starts: int) -> list[tuple[str, float, Summary]]:
    """The policy choosing between fleets with different traces: p3.2xlarge in us-east-1 on
    Bamboo's churning p3 fleet, or the same type and price in a second region whose fleet is
    the calmer GCP V100 trace, with 8 nodes there, or 4 at half the speed. The catalog's one
    prior for both; the other strategies know only the first fleet."""
    catalog, policy = snapshot(), load_policies()[policy_name]
    p3 = next(o for o in catalog.offers if o.instance_type == "p3.2xlarge")
    west = p3.model_copy(update={"region": "us-west-2"})
    churny = load_trace(TRACES / "bamboo/p3-trace.csv")
    calm = load_trace(TRACES / "bamboo/v100x1-east1c.txt")
    rows = []
    for label, alternative in (("or 8 on a calm fleet", Fleet(west, 8, calm)),
                               ("or 4 at half speed on a calm fleet",
                                Fleet(west, 4, calm, speed=0.5))):
        for notice in (0.0, 120.0):
            job = the_job(p3, notice, alternatives=(alternative,))
            rows += [(label, notice, row) for row in compare(churny, job, policy, starts)]
    return rows


PRIOR_WEIGHTS = (1.0, 5.0, 20.0, 80.0, 320.0)  # node-hours


def sweep_prior(policy_name: str, starts: int) -> list[tuple[float, float, int]]:
    """The policy's mean cost summed over every trace and notice setting, and its deadline
    misses, for each weight of the catalog's prior rate (`prior_node_hours`)."""
    base = load_policies()[policy_name]
    found = []
    for weight in PRIOR_WEIGHTS:
        policy = base.model_copy(update={"prior_node_hours": weight})
        cost, misses = 0.0, 0
        for with_notice in (False, True):
            for trace, job in each_run(with_notice):
                row, = compare(trace, job, policy, starts, strategies=("policy",))
                cost, misses = cost + row.mean_cost_usd, misses + row.deadline_misses
        found.append((weight, cost, misses))
    return found


def plot(tables: dict[str, list[Summary]], path: Path) -> None:
    import matplotlib

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
                bars = ax.bar([x + i * width for x in range(len(traces))], values, width,
                              label=strategy)
                if field == "mean_hours":
                    for bar, t in zip(bars, traces):
                        misses = next(r.deadline_misses for r in rows
                                      if r.trace == t and r.strategy == strategy)
                        if misses:
                            ax.annotate(f"{misses} late", (bar.get_x(), bar.get_height()),
                                        fontsize=7, rotation=90, va="bottom")
            if field == "mean_hours":
                ax.axhline(12, color="grey", linestyle="--", linewidth=1)
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(traces))], traces,
                          fontsize=8)
            ax.set_title(f"{title}: {label}", fontsize=10)
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", type=Path,
                        default=Path(__file__).resolve().parent / "figures" / "spot_simulation.png")
    parser.add_argument("--policy", default="cost-first")
    parser.add_argument("--starts", type=int, default=11)
    args = parser.parse_args()
    tables = {}
    for with_notice in (False, True):
        began = time.perf_counter()
        rows = run(with_notice, args.policy, args.starts)
        title = "with the cloud's notice (AWS 120 s, GCP 30 s)" if with_notice else \
            "no notice"
        tables[title] = rows
        print(f"\n## {title} (policy {args.policy}; {time.perf_counter() - began:.1f} s)")
        print("| trace | strategy | mean $ | mean h | deadline misses | preemptions | "
              "work lost h | on-demand h |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r.trace} | {r.strategy} | {r.mean_cost_usd:.2f} | {r.mean_hours:.2f} | "
                  f"{r.deadline_misses}/{r.runs} | {r.mean_preemptions:.1f} | "
                  f"{r.mean_lost_work_hours:.2f} | {r.mean_on_demand_hours:.2f} |")
        print()
        print("\n".join(gaps(rows)))
    began = time.perf_counter()
    chosen = two_fleets(args.policy, args.starts)
    print(f"\n## 8 x p3.2xlarge on the p3 fleet, or another fleet "
          f"({time.perf_counter() - began:.1f} s)")
    print("| alternative | notice s | strategy | mean $ | mean h | deadline misses | "
          "preemptions | work lost h | on-demand h |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for label, notice, r in chosen:
        print(f"| {label} | {notice:.0f} | {r.strategy} | {r.mean_cost_usd:.2f} | "
              f"{r.mean_hours:.2f} | {r.deadline_misses}/{r.runs} | {r.mean_preemptions:.1f} | "
              f"{r.mean_lost_work_hours:.2f} | {r.mean_on_demand_hours:.2f} |")
    began = time.perf_counter()
    split = cost_split(args.policy, args.starts)
    print(f"\n## what the policy's bill paid for ({time.perf_counter() - began:.1f} s)")
    print("\n".join(split))
    began = time.perf_counter()
    repairs = late_repairs(args.policy, args.starts)
    print(f"\n## Uniform Progress's late runs, made punctual with hindsight "
          f"({time.perf_counter() - began:.1f} s)")
    print("\n".join(repairs) or "none late")
    began = time.perf_counter()
    swept = sweep_prior(args.policy, args.starts)
    print(f"\n## the prior's weight ({time.perf_counter() - began:.1f} s)")
    print("| prior_node_hours | policy's mean $, summed over the 8 runs | deadline misses |")
    print("|---:|---:|---:|")
    for weight, cost, misses in swept:
        print(f"| {weight:g} | {cost:.2f} | {misses} |")
    best = min((w for w in swept if w[2] == 0), key=lambda w: w[1], default=None)
    print(f"\ncheapest without a miss: {best[0]:g} node-hours" if best else "\nall miss")
    plot(tables, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
