"""The autoscaling policy, with plain values (replays of traces: tests/pure/test_replay.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain.catalog.prices import band_rate
from raytrain.catalog.traces import load_trace
from raytrain.core.autoscale import (
    Goal,
    Observed,
    choose,
    options,
    redecide,
    with_history,
)
from raytrain.core.costs import job_costs, ready_key
from raytrain.core.interval import expected_time_s, optimal_interval_s
from raytrain.core.planner import ModelDims, Workload, fastest
from raytrain.core.shapes import node_shape_of
from raytrain.core.throughput import planner_throughput
from raytrain.errors import SpecError
from raytrain.spec import Offer, PolicySpec
from raytrain.spec.files import DEFAULT_POLICY_DIR, TRACES_DIR, load_policies, snapshot
from raytrain.testing.jobs import offer

TRACES = TRACES_DIR
POLICIES = load_policies()
COST_FIRST = POLICIES["cost-first"]
LLAMA_8B = ModelDims.from_gpt(32, 4096, 32, 14336, 128256, 8192, 0)
LLAMA_70B = ModelDims.from_gpt(80, 8192, 64, 28672, 128256, 4096, 0)




def test_the_shipped_policies_and_offers_validate() -> None:
    assert set(POLICIES) >= {"cost-first", "deadline-aware", "on-demand-only", "spot-only"}
    assert POLICIES["on-demand-only"].markets == ["on-demand"]
    assert POLICIES["spot-only"].markets == ["spot"]
    catalog = snapshot()
    assert {o.gpu_kind for o in catalog.offers} >= {"rtx4090", "h100-sxm", "l40s"}
    p5 = catalog.find("aws/us-east-1/p5.48xlarge")
    assert p5 is not None and p5.spot_interruptions_per_hour == pytest.approx(band_rate(">20%"))


def test_a_bad_policy_file_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "fast.yaml").write_text("name: fast\ndescription: x\nmarkets: [spot, cheap]\n")
    with pytest.raises(SpecError) as caught:
        load_policies(tmp_path)
    assert caught.value.errors[0].loc[:1] == ("markets",)
    (tmp_path / "fast.yaml").write_text("name: quick\ndescription: x\n")
    with pytest.raises(SpecError, match="To fix: name it 'fast'"):
        load_policies(tmp_path)
    with pytest.raises(SpecError, match="policy_dir"):
        load_policies(tmp_path / "missing")
    assert DEFAULT_POLICY_DIR.is_dir()


def test_an_offer_needs_known_parts_and_a_price() -> None:
    with pytest.raises(ValueError) as caught:
        Offer(provider="x", region="r", instance_type="i", gpu_kind="tpu", gpus_per_node=1,
              intra_link="wormhole", network_gbps=10)
    text = str(caught.value)
    assert "gpu_kind" in text and "intra_link" in text and "on_demand_usd_per_hour" in text


@settings(max_examples=50, deadline=None)
@given(st.floats(1.0, 600.0), st.floats(1e-6, 1e-2), st.floats(0.0, 600.0),
       st.floats(0.0, 0.9))
def test_the_checkpoint_interval_minimises_the_expected_time(
    cost_s: float, rate_per_s: float, restart_s: float, coverage: float
) -> None:
    tau = optimal_interval_s(cost_s, rate_per_s, restart_s, coverage)
    assert tau is not None and tau > 0

    def t(interval: float) -> float:
        return expected_time_s(3600.0, rate_per_s, interval, cost_s, restart_s, coverage)

    if math.isfinite(t(tau)):
        assert t(tau) <= t(tau * 0.9) and t(tau) <= t(tau * 1.1)
    # Young's interval where checkpoints and restarts are cheap against the time between.
    assert optimal_interval_s(1.0, 1e-6) == pytest.approx(math.sqrt(2 / 1e-6), rel=1e-3)
    assert optimal_interval_s(cost_s, 0.0) is None


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from([(2, 512, 8), (12, 2048, 16), (32, 4096, 32)]),
    st.lists(st.sampled_from(["rtx4090", "l40s", "h100-sxm", "a100-80gb-sxm"]), min_size=1,
             max_size=3, unique=True),
    st.sampled_from([None, 40.0, 400.0]),
)
def test_never_picks_an_offer_that_cannot_hold_the_plan_or_costs_too_much(
    model: tuple[int, int, int], gpus: list[str], max_hourly: float | None
) -> None:
    layers, dim, heads = model
    dims = ModelDims.from_gpt(layers, dim, heads, 4 * dim, 32000, 2048, 0)
    work = Workload(global_batch=64)
    offers = [offer(g, gpu=g, link="pcie4-no-p2p" if g == "rtx4090" else "nvlink4",
                    on_demand=3.0 * (i + 1), spot=1.5 * (i + 1)) for i, g in enumerate(gpus)]
    goal = Goal(tokens_left=64 * 2048 * 1000, max_usd_per_hour=max_hourly)
    decision = choose(goal, offers, planner_throughput(dims, work), COST_FIRST)
    if decision.option is None:
        assert decision.action == "wait" and "no offer" in decision.reason
        return
    chosen = decision.option
    shape = node_shape_of(chosen.offer)
    best = fastest(dims, work, chosen.nodes * chosen.offer.gpus_per_node, shape)
    assert best is not None and best.memory_bytes <= best.memory_limit_bytes
    assert max_hourly is None or chosen.usd_per_hour <= max_hourly


def test_prefers_nvlink_when_the_plan_needs_tensor_parallelism() -> None:
    """70B on up to 32 GPUs needs tensor parallelism: at the same price per GPU-hour the NVLink
    node beats PCIe without peer-to-peer by a wide margin (RTX 4090s at a fifth of the price
    cannot hold it at all)."""
    work = Workload(global_batch=64)
    nvlink = offer("nvlink", link="nvlink4", on_demand=16.0, spot=None)
    pcie = offer("pcie", link="pcie4-no-p2p", on_demand=16.0, spot=None, gbps=100, rdma=False)
    rtx = offer("rtx", gpu="rtx4090", link="pcie4-no-p2p", on_demand=3.2, spot=None, gbps=25,
                rdma=False)
    through = planner_throughput(LLAMA_70B, work)
    goal = Goal(tokens_left=64 * 4096 * 2000)
    ranked = options(goal, [nvlink, pcie, rtx], through, COST_FIRST.model_copy(
        update={"max_nodes": 4}))
    assert ranked[0].offer.instance_type == "nvlink"
    by_name = {(o.offer.instance_type, o.nodes): o for o in ranked}
    assert by_name[("nvlink", 4)].tokens_per_s > 1.5 * by_name[("pcie", 4)].tokens_per_s
    assert "tp" in by_name[("nvlink", 4)].layout
    assert not any(o.offer.instance_type == "rtx" for o in ranked)


def _spot_and_on_demand(rate: float) -> tuple[Offer, Goal, PolicySpec]:
    market = offer("h100", on_demand=20.0, spot=8.0, rate=rate)
    return market, Goal(tokens_left=128 * 8192 * 3000), POLICIES["deadline-aware"]


def test_moves_to_on_demand_when_spot_can_no_longer_meet_the_deadline() -> None:
    market, goal, policy = _spot_and_on_demand(rate=0.3)
    through = planner_throughput(LLAMA_8B, Workload(global_batch=128))
    fixed = lambda o, nodes: through(o, nodes) if nodes == 2 else None  # noqa: E731
    start = choose(goal, [market], fixed, policy)
    assert start.option is not None and start.option.market == "spot"  # no deadline yet
    spot_hours = start.option.expected_hours
    od = choose(goal, [market], fixed, policy.model_copy(update={"markets": ["on-demand"]}))
    assert od.option is not None and od.option.expected_hours < spot_hours
    # A deadline between the two, with the margin: spot can no longer make it.
    tight = Goal(goal.tokens_left, deadline_s=od.option.expected_s * 1.26)
    assert spot_hours * 3600 * 1.25 > tight.deadline_s
    decision = redecide(start.option, "progress", tight, [market], fixed, policy, Observed())
    assert (decision.action, decision.option.market) == ("switch", "on-demand")
    assert "behind the deadline" in decision.reason and decision.at_checkpoint
    # With room before the deadline it stays on spot.
    roomy = Goal(goal.tokens_left, deadline_s=spot_hours * 3600 * 2)
    assert redecide(start.option, "progress", roomy, [market], fixed, policy,
                    Observed()).action == "stay"


def test_fails_over_after_preemptions_and_around_missing_capacity() -> None:
    market, goal, policy = _spot_and_on_demand(rate=0.05)
    through = planner_throughput(LLAMA_8B, Workload(global_batch=128))
    start = choose(goal, [market], through, policy)
    assert start.option is not None and start.option.market == "spot"
    once = with_history(Observed(), market.id, 1, 3.0)
    assert redecide(start.option, "preemption", goal, [market], through, policy,
                    once).option.market == "spot"
    twice = with_history(once, market.id, 1, 1.0)  # deadline-aware fails over after two
    decision = redecide(start.option, "preemption", goal, [market], through, policy, twice)
    assert decision.option.market == "on-demand" and "after 2 preemption" in decision.reason
    missing = Observed(unavailable=frozenset({(market.id, "spot")}))
    decision = redecide(start.option, "capacity-missing", goal, [market], through, COST_FIRST,
                        missing)
    assert (decision.action, decision.option.market) == ("switch", "on-demand")
    spot_only = POLICIES["spot-only"]
    assert choose(goal, [market], through, spot_only, missing).action == "wait"


def test_observed_preemptions_raise_the_rate_and_shorten_the_interval() -> None:
    market = offer("h100", rate=0.001)
    assert Observed().rate(market, 20.0) == pytest.approx(0.001)
    seen = with_history(Observed(), market.id, 10, 20.0)
    assert seen.rate(market, 20.0) == pytest.approx((0.02 + 10) / 40)
    through = planner_throughput(LLAMA_8B, Workload(global_batch=128))
    goal = Goal(tokens_left=128 * 8192 * 3000)
    spot_only = POLICIES["spot-only"]
    before = choose(goal, [market], through, spot_only).option
    after = choose(goal, [market], through, spot_only, seen).option
    assert after.checkpoint_interval_s < before.checkpoint_interval_s
    assert after.expected_cost_usd > before.expected_cost_usd


def test_switches_to_a_cheaper_offer_only_when_the_saving_pays() -> None:
    through = planner_throughput(LLAMA_8B, Workload(global_batch=128))
    goal = Goal(tokens_left=128 * 8192 * 20000)
    here = offer("here", on_demand=20.0, spot=None)
    policy = POLICIES["on-demand-only"]
    current = choose(goal, [here], through, policy).option
    slightly = offer("slightly", on_demand=19.0, spot=None)
    much = offer("much", on_demand=10.0, spot=None)
    assert redecide(current, "prices", goal, [here, slightly], through, policy,
                    Observed()).action == "stay"
    decision = redecide(current, "prices", goal, [here, much], through, policy, Observed())
    assert decision.action == "switch" and decision.option.offer.instance_type == "much"
    assert decision.at_checkpoint


def test_budget_limits_the_choice() -> None:
    through = planner_throughput(LLAMA_8B, Workload(global_batch=128))
    market = offer("h100", on_demand=20.0, spot=None)
    goal = Goal(tokens_left=128 * 8192 * 3000)
    free = choose(goal, [market], through, POLICIES["on-demand-only"]).option
    assert free is not None
    capped = choose(Goal(goal.tokens_left, budget_usd=free.expected_cost_usd * 0.5), [market],
                    through, POLICIES["on-demand-only"])
    assert "budget" in capped.reason


def test_count_traces_become_events(tmp_path: Path) -> None:
    trace = load_trace(TRACES / "bamboo/a100x1-east1b.txt")
    assert trace.events[0].kind == "add" and trace.duration_s > 3600
    (tmp_path / "bad.csv").write_text("a;b;c\n")
    with pytest.raises(SpecError, match="To fix"):
        load_trace(tmp_path / "bad.csv")


def test_a_spot_wait_for_capacity_does_not_price_the_on_demand_fallback() -> None:
    """Node-ready times are measured per market: a spot request's includes waiting for
    capacity the market lacked, which an on-demand request of the same offer never waits
    for. Keyed per offer alone, the on-demand fallback would be priced with the spot wait
    (and a job near its regret cap sent to on-demand for good)."""
    market, goal, policy = _spot_and_on_demand(rate=0.05)
    through = planner_throughput(LLAMA_8B, Workload(global_batch=128))
    fixed = lambda o, nodes: through(o, nodes) if nodes == 2 else None  # noqa: E731
    waited = job_costs(policy, None, {ready_key(market.id, "spot"): (1, 3000.0)})
    spot, on_demand = (next(o for o in options(goal, [market], fixed, policy, costs=waited)
                            if o.market == m) for m in ("spot", "on-demand"))
    plain = job_costs(policy, None)
    assert on_demand.expected_s == next(o for o in options(goal, [market], fixed, policy,
                                                           costs=plain)
                                        if o.market == "on-demand").expected_s
    assert spot.expected_s - on_demand.expected_s > 3000 - policy.ready_s - 1
    assert waited.ready_measured(market.id, "spot")
    assert not waited.ready_measured(market.id, "on-demand")
    assert "spot nodes ready 3e+03 s measured" in waited.describe(market.id)
