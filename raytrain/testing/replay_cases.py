"""The replays the differential test holds the simulator to (tests/pure/test_replay_fast.py):
each strategy the live service replays, from two start times, on a shipped fleet trace of
8 nodes and on a seeded single-node trace of long outages, with the cloud's notice and
without; and what a replay decided and billed, as plain values (`fingerprint`).

`python -m raytrain.testing.replay_cases OUT.json` writes the fingerprints of the code that runs
it: the file the test compares with was written by the replay before its clock jumped from
event to event (commit 46ec4bb; written again where the service's decisions changed on
purpose, tests/pure/test_replay_same_decisions.py says when), and a change that alters a
decision, a bill or a time fails the test.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

from raytrain.catalog.traces import Trace, load_trace
from raytrain.sim.replay import (
    Market,
    Replayed,
    Scenario,
    baseline_policies,
    gpt_job,
    replay_job,
    with_policy,
)
from raytrain.sim.simulation import NO_NOTICE, _rigid
from raytrain.sim.workers import CloudTimes
from raytrain.spec.files import TRACES_DIR, load_policies, snapshot

HOUR = 3600.0
GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "data" / "replay_golden.json"
SERVICE_STRATEGIES = ("on-demand", "spot", "failover", "policy-rigid", "policy")


def outage_trace(hours: float = 60.0, seed: int = 11) -> Trace:
    """One spot node that comes and goes: up about 2.5 h, gone about 1.5 h (seeded), as a
    counts trace a user would bring."""
    rng = random.Random(seed)
    lines, t, alive = ["0,1"], 0.0, 1
    while True:
        t += rng.expovariate(1 / ((2.5 if alive else 1.5) * HOUR))
        if t >= hours * HOUR:
            break
        alive = 1 - alive
        lines.append(f"{int(t * 1000)},{alive}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"outage-{hours:g}h.csv"
        path.write_text(f"# span_s: {int(hours * HOUR)}\n" + "\n".join(lines) + "\n")
        return load_trace(path, "outage")


def cases() -> Iterator[tuple[str, Scenario, float]]:
    """(name, scenario, start) of every replay the test compares."""
    policy = load_policies()["cost-first"]
    offer = next(o for o in snapshot().offers if o.instance_type == "p3.2xlarge")
    traces = ((load_trace(TRACES_DIR / "bamboo/p3-trace.csv"), 8, 2.0, 5.0, (0.0, 5 * HOUR)),
              (outage_trace(), 1, 6.0, 12.0, (0.0, 20 * HOUR)))
    for trace, nodes, work_h, deadline_h, starts in traces:
        spec = gpt_job(offer, nodes, work_h * HOUR, deadline_h * HOUR, policy.name)
        markets = (Market(offer, "spot", trace), Market(offer, "on-demand"))
        for notice, said in ((None, "cloud"), (NO_NOTICE, "none")):
            base = Scenario(spec, markets, baseline_policies(policy, 1800.0), CloudTimes(),
                            notice)
            for strategy in SERVICE_STRATEGIES:
                ours = strategy.startswith("policy")
                chosen = base if strategy == "policy" else replace(base, spec=_rigid(spec))
                scenario = with_policy(chosen, policy.name if ours else strategy)
                for start in starts:
                    yield (f"{trace.name}/{nodes}/{said}/{strategy}/{start / HOUR:g}h",
                           scenario, start)


def fingerprint(run: Replayed) -> dict[str, Any]:
    """What a replay decided, when, and what it billed (times from the job's creation)."""
    job = run.status
    t0 = job.created_at
    return {
        "state": job.state.value,
        "finished_s": None if job.finished_at is None else job.finished_at - t0,
        "cost_usd": job.cost_usd, "cloud_usd": run.cloud_usd, "idle_usd": run.idle_usd,
        "on_demand_node_s": run.on_demand_node_s, "spot_node_s": run.spot_node_s,
        "preemptions": job.preemptions, "lost_steps": job.lost_steps,
        "restarts": job.restarts, "step": job.progress.step,
        "checkpoint": None if job.checkpoint is None else job.checkpoint.step,
        "decisions": [[d.time - t0, d.event, d.action, d.offer, d.market, d.nodes,
                       d.checkpoint_interval_s, d.reason] for d in job.decisions],
        "preemption_log": [[p.time - t0, p.notice, p.group, p.lost_steps, p.reached_step]
                           for p in job.preemption_log],
    }


def run_all() -> dict[str, dict[str, Any]]:
    return {name: fingerprint(replay_job(scenario, start)) for name, scenario, start in cases()}


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(run_all(), indent=1, sort_keys=True) + "\n")
