"""The simulator's yardsticks (the hindsight-optimal schedule, Can't Be Late's Uniform
Progress) and the policy's deadline fallback, with plain values and the shipped traces. The
replay of the live service itself is tests/pure/test_replay.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from raytrain.cli import main as cli_main
from raytrain.core.autoscale import Goal, Observed, choose, options, redecide
from raytrain.core.fleet import SimJob, SimResult, Trace, TraceEvent
from raytrain.core.hindsight import hindsight
from raytrain.core.simulate import STRATEGIES, _State, uniform_progress, uniform_progress_move
from raytrain.core.tally import Tally
from raytrain.serve.jobs.store import JobStore
from raytrain.spec import JobStatus
from raytrain.spec.files import load_policies, snapshot
from raytrain.testing.jobs import offer
from tests.support.service import small_job

COST_FIRST = load_policies()["cost-first"]
HOUR = 3600.0


def one_node_job(work_h: float, deadline_h: float | None, nodes: int = 1) -> SimJob:
    priced = offer("n1", gpus=1, on_demand=3.6, spot=1.2)
    return SimJob(offer=priced, nodes=nodes, work_s=work_h * HOUR, restart_s=300, ready_s=0,
                  deadline_s=None if deadline_h is None else deadline_h * HOUR)


def test_the_oracle_finds_the_schedule_worked_out_by_hand() -> None:
    """Spot node a lives 0-2 h, nothing until b comes at 5 h; 3 h of work by 6 h.
    Spot a gives 2 h - 300 s restart - 60 s checkpoint = 6,840 s of work; spot b from 5 h
    to the deadline 3,600 - 300 = 3,300 s. That is 660 s short, so the cheapest schedule
    buys 660 s of on-demand work in the gap (300 s restart + 660 s + 60 s checkpoint)."""
    trace = Trace("gap", (TraceEvent(0, "add", "a"), TraceEvent(2 * HOUR, "remove", "a"),
                          TraceEvent(5 * HOUR, "add", "b")), 5 * HOUR + 60)
    best = hindsight(trace, one_node_job(3, 6))
    spot_s, on_demand_s = 2 * HOUR + 1 * HOUR, 300 + 660 + 60
    assert best.cost_usd == pytest.approx((spot_s * 1.2 + on_demand_s * 3.6) / HOUR)
    assert best.on_demand_s == on_demand_s
    assert best.finished_s == 6 * HOUR and best.met_deadline and best.lost_work_s == 0
    assert best.preemptions == 1  # a's run ended by the trace; b's run finished the job
    # With time to spare it waits for b rather than pay for on-demand at all.
    relaxed = hindsight(trace, one_node_job(3, 10))
    assert relaxed.on_demand_s == 0
    assert relaxed.cost_usd == pytest.approx((2 * HOUR + 300 + 3960) * 1.2 / HOUR)
    # Too little time even with hindsight: no finish, said so.
    hopeless = hindsight(trace, one_node_job(3, 3))
    assert not hopeless.met_deadline and math.isinf(hopeless.finished_s)
    assert "nothing finishes" in hopeless.decisions[0]


def test_the_oracle_holds_the_nodes_that_live_longest_worked_out_by_hand() -> None:
    """Two nodes, three spot machines: a lives 0-1 h, b 0-5 h, c from 0.5 h to the end; 3 h
    of work by 6 h. Knowing the trace, the oracle starts at 0.5 h on b and c (a would end its
    run at 1 h) and runs to 3.5 h + 300 s: one spot run of 3 h 5 min on two nodes, no
    preemption. A schedule that took the first two machines (a and b) would meet one at
    1 h. It fails if the oracle took the first nodes alive, or billed one node."""
    trace = Trace("staggered", (TraceEvent(0, "add", "a"), TraceEvent(0, "add", "b"),
                                TraceEvent(0.5 * HOUR, "add", "c"),
                                TraceEvent(1 * HOUR, "remove", "a"),
                                TraceEvent(5 * HOUR, "remove", "b")), 24 * HOUR)
    best = hindsight(trace, one_node_job(3, 6, nodes=2))
    run_s = 300 + 3 * HOUR
    assert best.cost_usd == pytest.approx(2 * 1.2 * run_s / HOUR)
    assert best.finished_s == pytest.approx(0.5 * HOUR + run_s)
    assert best.preemptions == 0 and best.on_demand_s == 0 and best.met_deadline
    # Due by 3.4 h, c cannot be waited for: a and b from 0 until a goes at 1 h (300 s
    # restart, work, a 60 s checkpoint), then b and c for the rest after another restart.
    tight = hindsight(trace, one_node_job(3, 3.4, nodes=2))
    first_s = 1 * HOUR
    second_s = 300 + 3 * HOUR - (first_s - 360)
    assert tight.cost_usd == pytest.approx(2 * 1.2 * (first_s + second_s) / HOUR)
    assert tight.preemptions == 1 and tight.on_demand_s == 0
    assert tight.met_deadline  # waiting idle costs nothing: it may finish at the deadline


def test_uniform_progress_follows_the_papers_rules() -> None:
    job = one_node_job(6, 12)  # expected progress: half an hour of work per hour
    move = uniform_progress_move
    on_demand = _State(market="on-demand", done_s=3 * HOUR, saved_s=3 * HOUR)
    assert move(on_demand, job, now=5 * HOUR) == "spot"  # ahead of 5 h + 2 restarts
    assert move(on_demand, job, now=5.9 * HOUR) is None  # not past t + 2d yet
    waiting = _State(market="spot", done_s=2 * HOUR, saved_s=2 * HOUR, waiting_since=0.0)
    assert move(waiting, job, now=3 * HOUR) is None  # idle but ahead: wait
    assert move(waiting, job, now=5 * HOUR) == "on-demand"  # idle and behind
    running = _State(market="spot", done_s=1 * HOUR, saved_s=1 * HOUR)
    assert move(running, job, now=5 * HOUR) is None  # on spot: kept
    late = _State(market="spot", done_s=4 * HOUR, saved_s=4 * HOUR, waiting_since=0.0)
    assert move(late, job, now=10 * HOUR - 100) == "on-demand"  # the safety net


def calm_run_moved_at_2_hours() -> tuple[SimResult, SimResult]:
    """Uniform Progress on a spot node that is never taken: as it is, and moved to on-demand
    from 2 h."""
    trace = Trace("calm", (TraceEvent(0, "add", "a"),), 24 * HOUR)
    job = one_node_job(3, 6)
    return (uniform_progress(trace, job, COST_FIRST),
            uniform_progress(trace, job, COST_FIRST, on_demand_from_s=2 * HOUR))


def test_a_late_run_is_made_punctual_by_a_move_to_on_demand_at_a_chosen_time() -> None:
    """benchmarks.spot_simulation's hindsight repair of Uniform Progress's late runs: from
    the time given to the end, the job is on demand, and it never goes back to spot."""
    plain, moved = calm_run_moved_at_2_hours()
    assert plain.on_demand_s == 0 and plain.met_deadline
    assert moved.met_deadline and moved.cost_usd > plain.cost_usd
    assert moved.on_demand_s == pytest.approx(moved.finished_s - 2 * HOUR)
    assert moved.decisions == ["2.00 h: on-demand"]


def test_a_cheap_slow_option_is_tried_only_while_there_is_time_to_fall_back() -> None:
    """Spot here is expected to miss the deadline; on-demand is not. With room before the
    deadline for spot's worst case (an interval of work lost, a new node, a restart and a
    review) and the fallback's slack, the policy tries spot; without it, on-demand."""
    churny = offer("p", gpus=1, on_demand=10.0, spot=2.0, rate=0.5)

    def throughput(_offer: object, nodes: int) -> tuple[float, str] | None:
        return (1.0, "dp1") if nodes == 1 else None

    work = 6 * HOUR  # tokens at 1 token/s: 6 h on demand, 6.75 h with its start and margin
    # Spot's worst case takes about 0.5 h and the fallback's slack 0.5 h: at 8 h there is
    # room for both, at 7 h for neither.
    plenty = choose(Goal(tokens_left=work, deadline_s=8 * HOUR), [churny], throughput,
                    COST_FIRST)
    assert plenty.option is not None and plenty.option.market == "spot", plenty.reason
    assert plenty.option.expected_s * 1.1 > 8 * HOUR, "the test needs spot to look late"
    assert "fall back" in plenty.reason
    tight = choose(Goal(tokens_left=work, deadline_s=7 * HOUR), [churny], throughput,
                   COST_FIRST)
    assert tight.option is not None and tight.option.market == "on-demand"
    # Running on spot when the room runs out: move (at a checkpoint) to on-demand.
    moved = redecide(plenty.option, "progress", Goal(tokens_left=work, deadline_s=7 * HOUR),
                     [churny], throughput, COST_FIRST, Observed())
    assert moved.action == "switch" and moved.option is not None
    assert moved.option.market == "on-demand" and moved.at_checkpoint
    strict = COST_FIRST.model_copy(update={"fallback_slack_s": 1e9})
    assert choose(Goal(tokens_left=work, deadline_s=8 * HOUR), [churny], throughput,
                  strict).option.market == "on-demand"


def test_with_no_time_in_hand_the_policy_takes_no_preemption_risk() -> None:
    """A calm spot offer, expected in time either way: with hours in hand it is bought; with
    no room for its worst case and the fallback's slack (on-demand's start and margin leave
    15 minutes) on-demand is, though spot is cheaper, since one preemption there would make
    the job late."""
    calm = offer("c", gpus=1, on_demand=10.0, spot=2.0, rate=0.001)

    def throughput(_offer: object, nodes: int) -> tuple[float, str] | None:
        return (1.0, "dp1") if nodes == 1 else None

    work = 6 * HOUR
    roomy = choose(Goal(tokens_left=work, deadline_s=12 * HOUR), [calm], throughput,
                   COST_FIRST).option
    tight = choose(Goal(tokens_left=work, deadline_s=7.0 * HOUR), [calm], throughput,
                   COST_FIRST).option
    assert roomy is not None and roomy.market == "spot"
    assert tight is not None and tight.market == "on-demand"
    spot_then = next(o for o in options(Goal(tokens_left=work, deadline_s=7.0 * HOUR), [calm],
                                        throughput, COST_FIRST) if o.market == "spot")
    assert spot_then.expected_s * 1.1 <= 7.0 * HOUR  # spot was expected in time too


def test_every_strategy_of_the_tables_has_a_run_and_every_run_a_strategy() -> None:
    from raytrain.sim.simulation import STRATEGY_RUNS

    assert sorted(STRATEGY_RUNS) == sorted(STRATEGIES) and len(STRATEGIES) == 7


def test_simulate_json_has_every_strategy_per_trace_and_notice(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["simulate", "--json", "--starts", "2", "--notice-s", "0",
                     "--notice-s", "cloud", "--work-hours", "1", "--deadline-hours", "3"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["trace"], r["notice_s"]) for r in runs] == [("p3-trace", 0.0),
                                                           ("p3-trace", 120.0)]
    for run in runs:
        assert set(run["strategies"]) == set(STRATEGIES)
        for figures in run["strategies"].values():
            assert set(figures) >= {"mean_cost_usd", "mean_hours", "deadline_misses",
                                    "mean_preemptions", "mean_lost_work_hours",
                                    "saving_vs_on_demand", "runs"}
        assert run["strategies"]["on-demand"]["saving_vs_on_demand"] == 0.0
        assert run["strategies"]["oracle"]["saving_vs_on_demand"] > 0.5


def test_offers_show_what_the_service_has_seen_beside_the_prior(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The exposure a service counted (its store's tally) outlives it, and `raytrain offers`
    on that machine shows it next to the catalog's prior, with the rate the policy uses."""
    p3 = "aws/us-east-1/p3.2xlarge"
    tally = Tally()
    tally.spot[p3] = (12, 20.0)
    job = JobStatus.model_validate({"id": "j", "state": "PENDING", "spec": small_job(),
                                    "created_at": 0.0})
    JobStore(tmp_path / "jobs.db").put(job, 0, tally.to_json())
    assert cli_main(["offers", "--state-dir", str(tmp_path), "--json"]) == 0
    seen = {r["offer"]: r for r in json.loads(capsys.readouterr().out)["observed"]}
    prior = snapshot().find(p3).spot_interruptions_per_hour
    assert seen[p3]["preemptions"] == 12 and seen[p3]["spot_node_hours"] == 20.0
    assert seen[p3]["estimate_per_node_hour"] == pytest.approx((prior * 20 + 12) / 40)
    assert cli_main(["offers", "--state-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "spot preemptions this service has seen" in shown and "20.0" in shown
    assert cli_main(["offers", "--state-dir", str(tmp_path / "nothing-here"), "--json"]) == 0
    assert all(r["preemptions"] == 0 for r in json.loads(capsys.readouterr().out)["observed"])
