"""What one spot preemption costs a job, in node-seconds that train nothing, with its replica
groups training on (elastic, as the service runs a job of several groups) and as a rigid job
(every group stops, restarts from the last checkpoint on a replacement).

    python -m benchmarks.preemption_cost [--starts 4] [--work-h 6] [--deadline-h 12]

The same job (a GPT-2 small on 8 nodes, the spot market only: the `spot` policy, so every
preemption is met on spot and both modes meet the same ones) on the shipped p3 and g4dn
traces, with AWS's notice and without, replayed through the live service
(raytrain.sim.replay: its job manager, scheduler, lifecycle and bill, on the simulated cloud
and clock) from `--starts` start times an hour apart. A preemption's cost is the node-seconds
billed beyond the training work, the checkpoints and the first start, divided by the
preemptions (raytrain.sim.replay.as_sim_result).
"""

from __future__ import annotations

import argparse
import statistics

from raytrain.catalog.traces import load_trace
from raytrain.sim.replay import (
    Market,
    Scenario,
    as_sim_result,
    baseline_policies,
    gpt_job,
    replay_job,
    with_policy,
)
from raytrain.sim.simulation import NO_NOTICE, _rigid
from raytrain.sim.workers import CloudTimes
from raytrain.spec.files import TRACES_DIR, load_policies, snapshot

HOUR = 3600.0
TRACES = [("bamboo/p3-trace.csv", "p3.2xlarge"), ("bamboo/g4dn-trace.csv", "g4dn.xlarge")]


def scenarios(trace_file: str, instance: str, notice: tuple[float, float] | None,
              work_h: float, deadline_h: float) -> dict[str, Scenario]:
    offer = next(o for o in snapshot().offers if o.instance_type == instance)
    spec = gpt_job(offer, 8, work_h * HOUR, deadline_h * HOUR, "cost-first")
    trace = load_trace(TRACES_DIR / trace_file)
    elastic = with_policy(Scenario(
        spec, (Market(offer, "spot", trace), Market(offer, "on-demand")),
        baseline_policies(load_policies()["cost-first"], 1800), CloudTimes(), notice), "spot")
    rigid = Scenario(_rigid(elastic.spec), elastic.markets, elastic.policies, elastic.times,
                     notice)
    return {"elastic": elastic, "rigid": rigid}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--work-h", type=float, default=6.0)
    parser.add_argument("--deadline-h", type=float, default=12.0)
    args = parser.parse_args()
    print("| trace | notice | mode | preemptions | node-s per preemption | steps lost "
          "| cost $ |")
    print("|---|---|---|---:|---:|---:|---:|")
    for trace_file, instance in TRACES:
        for notice, said in ((None, "AWS 120 s"), (NO_NOTICE, "none")):
            found = scenarios(trace_file, instance, notice, args.work_h, args.deadline_h)
            per_mode: dict[str, float] = {}
            for mode, scenario in found.items():
                costs, preemptions, lost, dollars = [], 0, 0, 0.0
                for start in range(args.starts):
                    run = replay_job(scenario, start * HOUR)
                    result = as_sim_result(run, mode, trace_file, start * HOUR, None)
                    if result.preemption_node_s is not None:
                        costs.append(result.preemption_node_s)
                    preemptions += run.status.preemptions
                    lost += run.status.lost_steps
                    dollars += run.status.cost_usd
                per_mode[mode] = statistics.mean(costs) if costs else float("nan")
                print(f"| {trace_file.split('/')[-1]} | {said} | {mode} | {preemptions} | "
                      f"{per_mode[mode]:,.0f} | {lost} | {dollars / args.starts:,.2f} |",
                      flush=True)
            print(f"| | | rigid / elastic | | {per_mode['rigid'] / per_mode['elastic']:.1f}x "
                  "| | |", flush=True)


if __name__ == "__main__":
    main()
