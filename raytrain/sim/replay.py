"""The simulator is the live service: a job replayed on a spot trace goes through the job
manager, its scheduler, the provisioner and the capacity engine, the lifecycle and its bill,
exactly as a submitted job does, with the Ray adaptor replaced by a simulated cloud and
workers on a simulated clock (raytrain.sim.trace_cloud). Whatever the service decides and
bills, the replay decides and bills; the service's own settings (its ServiceConfig and the
policies) are the replay's.

What the replay sets, and why:
- the cloud's truths (`CloudTimes`: node-ready, restart, checkpoint stall), which the service
  measures as it goes, as it would live;
- the scheduler runs after every change in the cloud and every `tick_s` of simulated time
  (10 s; live, every ServiceConfig.scheduler_interval_s), and rank 0 reports every 30 s of
  simulated time (live, every second): the decisions' timing may differ by that much;
- the service's hourly ceiling is off (one job is replayed, not an operator's fleet), and the
  autoscaler lets idle nodes go at once.

Baselines that are policies run through the same service: `on-demand` (the on-demand-only
policy), `spot` (spot only, a checkpoint every fixed interval) and `failover` (spot until the
first preemption, then on-demand). Can't Be Late's Uniform Progress is not a policy of the
service; it and the hindsight-optimal schedule are computed by raytrain.core.simulate and
raytrain.core.hindsight under the same cloud figures.

    result = replay_job(scenario, start_s=3600.0)     # a SimResult, from the live service
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from raytrain.catalog.traces import Trace
from raytrain.core.fleet import SimJob, SimResult, replay
from raytrain.core.throughput import job_throughput
from raytrain.serve.jobs.manager import JobManager
from raytrain.sim.trace_cloud import NodeType, TraceCloud
from raytrain.sim.workers import CloudTimes
from raytrain.spec import JobSpec, JobState, JobStatus, Offer, PolicySpec, ServiceConfig

TICK_S = 10.0
SHM = Path("/dev/shm")


@dataclass(frozen=True)
class Market:
    """An offer the replayed service may buy in one market; `trace`: its spot capacity
    (None for on-demand: always there)."""

    offer: Offer
    market: str
    trace: Trace | None = None
    max_nodes: int = 0  # the node type's max_workers; 0: no limit

    @property
    def node_type(self) -> str:
        return f"{self.offer.instance_type}-{self.offer.region}-{self.market}"


@dataclass(frozen=True)
class Scenario:
    """A job, the markets it may buy, the cloud's truths, and the service's policies."""

    spec: JobSpec
    markets: tuple[Market, ...]
    policies: dict[str, PolicySpec]
    times: CloudTimes = CloudTimes()
    notice: tuple[float, float] | None = None  # (seconds, share); None: each offer's cloud's
    config: dict[str, object] = field(default_factory=dict)  # ServiceConfig overrides
    horizon_s: float = 20 * 24 * 3600.0
    tick_s: float = TICK_S

    @property
    def policy(self) -> str:
        return self.spec.capacity.policy or "cost-first"


@dataclass
class Replayed:
    """One replay's outcome, as the live service recorded it and as the cloud billed it."""

    status: JobStatus
    cloud_usd: float
    idle_usd: float  # the cloud's bill for nodes no job held (the autoscaler's idle tails)
    on_demand_node_s: float
    spot_node_s: float
    step_s: float  # the job's step time on its first choice (for work lost in seconds)

    @property
    def finished_s(self) -> float:
        job = self.status
        if job.state != JobState.SUCCEEDED or job.finished_at is None:
            return math.inf
        return job.finished_at - job.created_at


def replay_job(scenario: Scenario, start_s: float = 0.0) -> Replayed:
    """Replay the scenario's job from `start_s` into its traces through the live service."""
    with tempfile.TemporaryDirectory(dir=SHM if SHM.is_dir() else None) as tmp:
        folder = Path(tmp)
        config = _service_config(scenario, folder)
        horizon = scenario.horizon_s
        types = [NodeType(m.node_type, m.offer, m.market,
                          None if m.trace is None else tuple(replay(m.trace, start_s, horizon)),
                          scenario.notice) for m in scenario.markets]
        cloud = TraceCloud(types, scenario.times)
        manager = JobManager(config.model_dump(mode="json"), cluster=cloud, schedule=False,
                             persist=False).start()
        cloud.manager = manager
        try:
            job_id = manager.submit(scenario.spec).id  # a refusal raises, with its fix
            _drive(manager, cloud, job_id, cloud.time + horizon, scenario.tick_s)
            status = manager.records[job_id].status
            bill, idle = cloud.bill_usd(), cloud.idle_usd()
        finally:
            manager.shutdown()
    first = next((m for m in scenario.markets), None)
    fit = job_throughput(scenario.spec)(first.offer, _nodes(scenario.spec, first.offer)) \
        if first else None
    step_s = scenario.spec.tokens_per_step / fit[0] if fit else 0.0
    return Replayed(status, bill, idle, cloud.node_seconds("on-demand"),
                    cloud.node_seconds("spot"), step_s)


def _drive(manager: JobManager, cloud: TraceCloud, job_id: str, until: float,
           tick_s: float) -> None:
    """Scheduling passes after every change in the cloud and every tick, until the job ends
    (or the horizon: then it is cancelled, unfinished)."""
    next_pass, seen, quiet_until = cloud.time, -1, -math.inf
    scheduler = manager.scheduler
    while not manager.records[job_id].status.state.is_terminal:
        if cloud.time >= until:
            manager.cancel(job_id)
            scheduler.pass_once()
            break
        soonest = cloud.next_time()
        changed = cloud.advance(min(soonest, next_pass, until), soonest)
        if changed or cloud.time >= next_pass:
            now = cloud.time
            # Passes that would do nothing are skipped (Scheduler.idle_until): those where
            # nothing but progress happened since the last pass and nothing falls due. The
            # passes run are those of a scheduler passing every tick, as live.
            if changed or manager.lifecycle_changes != seen:
                quiet_until = now
            elif now >= quiet_until:
                quiet_until = scheduler.idle_until(now)
            if quiet_until <= now:
                scheduler.pass_once()
                seen, quiet_until = manager.lifecycle_changes, -math.inf
            next_pass = now + tick_s

def _service_config(scenario: Scenario, folder: Path) -> ServiceConfig:
    offers = {m.offer.id: m.offer for m in scenario.markets}
    if scenario.notice is not None:  # the service is told what the replayed cloud does
        seconds, share = scenario.notice
        offers = {key: offer.model_copy(update={"notice_s": seconds, "notice_share": share})
                  for key, offer in offers.items()}
    # JSON, which is YAML: written and read once per replay, and PyYAML's emitter was half
    # of a replay's set-up.
    (folder / "offers.yaml").write_text(json.dumps({"version": "replay", "offers": [
        o.model_dump(mode="json", exclude_none=True) for o in offers.values()]}))
    policies = folder / "policies"
    policies.mkdir()
    for name, policy in scenario.policies.items():
        (policies / f"{name}.yaml").write_text(json.dumps(policy.model_dump(mode="json")))
    settings: dict[str, object] = {
        "state_dir": str(folder / "state"), "offers_file": str(folder / "offers.yaml"),
        "policy_dir": str(policies), "auth": False, "max_usd_per_hour": None,
        "node_types": {m.node_type: {"offer": m.offer.id, "market": m.market,
                                     "max_nodes": m.max_nodes} for m in scenario.markets},
        **scenario.config}
    return ServiceConfig.model_validate(settings)


def _nodes(spec: JobSpec, offer: Offer) -> int:
    return max(1, spec.resources.num_workers // max(1, offer.gpus_per_node))


# ------------------------------------------------------------------ jobs and baselines


def gpt_job(offer: Offer, nodes: int, work_s: float, deadline_s: float | None,
            policy: str) -> JobSpec:
    """A data-parallel GPT-2 small (124M) on `nodes` of `offer`, with as many steps as the
    planner says take `work_s` there: the job of the simulator's tables."""
    on_gpu = offer.gpu_kind != "cpu"
    document = {
        "name": "replay",
        "model": {"kind": "gpt", "gpt": {"vocab_size": 50257, "dim": 768, "num_layers": 12,
                                         "num_heads": 12, "max_seq_len": 1024}},
        "data": {"kind": "synthetic", "seq_len": 1024},
        "training": {"steps": 1, "global_batch_size": 32 * nodes * offer.gpus_per_node,
                     "micro_batch_size": 4, "checkpoint_every_steps": 100_000_000,
                     "max_restarts": 0},
        "parallel": {"strategy": "data"},
        "resources": {"num_workers": nodes * offer.gpus_per_node,
                      "gpus_per_worker": 1 if on_gpu else 0,
                      "accelerator": offer.gpu_kind if on_gpu else None},
        "capacity": {"policy": policy,
                     "deadline_hours": None if deadline_s is None else deadline_s / 3600},
    }
    spec = JobSpec.model_validate(document)
    fit = job_throughput(spec)(offer, nodes)
    if fit is None:
        raise ValueError(f"the replay's job does not fit {nodes} x {offer.instance_type}")
    steps = max(1, round(work_s * fit[0] / spec.tokens_per_step))
    return spec.model_copy(update={"training": spec.training.model_copy(
        update={"steps": steps})})


BASELINES = ("on-demand", "spot", "failover")


def baseline_policies(base: PolicySpec, fixed_interval_s: float) -> dict[str, PolicySpec]:
    """The baselines as policies of the service (module doc), beside `base`."""
    plain = {"max_regret": None, "deadline_margin": 0.0, "fallback_slack_s": 0.0}
    return {
        base.name: base,
        "on-demand": PolicySpec(name="on-demand", description="on-demand only",
                                markets=["on-demand"]),
        "spot": PolicySpec(name="spot", description="spot only, fixed interval",
                           markets=["spot"], checkpoint_interval_s=fixed_interval_s,
                           capacity_wait_s=10**9, **plain),
        "failover": PolicySpec(name="failover", description="spot, then on-demand",
                               markets=["spot", "on-demand"], failover_after_preemptions=1,
                               checkpoint_interval_s=fixed_interval_s, capacity_wait_s=10**9,
                               **plain),
    }


def as_sim_result(replayed: Replayed, strategy: str, trace: str, start_s: float,
                  deadline_s: float | None) -> SimResult:
    """The replay in the simulator's terms (what the tables and the JSON show)."""
    job = replayed.status
    nodes = max(1, job.resources.nodes or 1)
    finished = replayed.finished_s
    result = SimResult(
        strategy, trace, start_s, finished, job.cost_usd, job.preemptions,
        job.lost_steps * replayed.step_s, replayed.on_demand_node_s / nodes,
        math.isfinite(finished) and (deadline_s is None or finished <= deadline_s),
        [f"{(d.time - job.created_at) / 3600:.2f} h {d.event}: {d.action} {d.reason}"
         for d in job.decisions])
    result.cloud_usd = replayed.cloud_usd
    if job.preemptions and math.isfinite(finished):
        price = job.resources.usd_per_hour / nodes if job.resources.usd_per_hour else 0.0
        if price > 0 and job.resources.market == "spot":  # held spot all along: node-seconds
            billed = job.cost_usd * 3600 / price
            work = job.spec.training.steps * replayed.step_s * nodes
            saves = job.costs.checkpoint_stall_s.samples * (
                job.costs.checkpoint_stall_s.measured_s or 0.0) * nodes
            first_start = (job.costs.restart_s.measured_s or 0.0) * nodes
            result.preemption_node_s = max(0.0, billed - work - saves - first_start) / \
                job.preemptions
    return result


def sim_job(spec: JobSpec, offer: Offer, times: CloudTimes, notice_s: float,
            fixed_interval_s: float) -> SimJob:
    """The same job for the strategies computed outside the service (Uniform Progress, the
    oracle): its work, deadline and the cloud's figures."""
    nodes = _nodes(spec, offer)
    fit = job_throughput(spec)(offer, nodes)
    assert fit is not None
    deadline = spec.capacity.deadline_hours
    return SimJob(offer=offer, nodes=nodes,
                  work_s=spec.training.steps * spec.tokens_per_step / fit[0],
                  deadline_s=None if deadline is None else deadline * 3600,
                  checkpoint_cost_s=times.checkpoint_s,
                  restart_s=times.ready_s + times.restart_s,
                  fixed_interval_s=fixed_interval_s, notice_s=notice_s)


def with_policy(scenario: Scenario, policy: str) -> Scenario:
    spec = scenario.spec
    return replace(scenario, spec=spec.model_copy(update={"capacity": spec.capacity.model_copy(
        update={"policy": policy})}))
