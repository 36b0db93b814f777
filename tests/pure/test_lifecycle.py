"""The job lifecycle with plain values: every allowed move, every forbidden one, what each
event does and costs, and random sequences of events."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain.core import lifecycle as lc
from raytrain.core.lifecycle import HOLDS, TRANSITIONS, allowed, enter
from raytrain.errors import IllegalTransition
from raytrain.spec import DecisionRecord, JobSpec, JobState, JobStatus, Resources

ENDS = {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}


def job_in(state: JobState) -> JobStatus:
    return JobStatus(id="ab12", state=state, spec=JobSpec(), created_at=1.0)


@pytest.mark.parametrize("old", list(JobState))
@pytest.mark.parametrize("new", list(JobState))
def test_each_move_is_allowed_or_refused_by_the_table(old: JobState, new: JobState) -> None:
    job = job_in(old)
    if allowed(old, new):
        enter(job, new, "because")
        assert job.state == new
        assert job.message == (None if new in (JobState.RUNNING, JobState.SUCCEEDED)
                               else "because")
    else:
        with pytest.raises(IllegalTransition, match=f"from {old.value} to {new.value}"):
            enter(job, new, "because")
        assert job.state == old


def test_an_ended_job_never_moves_and_every_move_names_its_reason() -> None:
    for end in ENDS:
        assert TRANSITIONS[end] == frozenset() and HOLDS[end] == ()
    with pytest.raises(ValueError):
        enter(job_in(JobState.PENDING), JobState.PROVISIONING, "")
    # the forward path and the recovery loop are all allowed
    path = [JobState.PENDING, JobState.PROVISIONING, JobState.RUNNING, JobState.RECOVERING,
            JobState.RUNNING, JobState.SUCCEEDED]
    assert all(allowed(a, b) for a, b in zip(path, path[1:]))


@given(st.lists(st.sampled_from(list(JobState)), max_size=30))
def test_random_requests_only_move_along_the_table(requests: list[JobState]) -> None:
    job, seen = job_in(JobState.PENDING), [JobState.PENDING]
    for wanted in requests:
        before = job.state
        try:
            enter(job, wanted, "requested")
        except IllegalTransition:
            assert job.state == before
            continue
        assert wanted in TRANSITIONS[before]
        seen.append(job.state)
    ended = [i for i, state in enumerate(seen) if state in ENDS]
    assert not ended or ended[0] == len(seen) - 1  # nothing after the end


# ------------------------------------------------------------- events and their effects

NOW = 1_700_000_000.0
BOUGHT = Resources(accelerator="h100-sxm", node_type="gpu-spot", offer="p5", market="spot",
                   nodes=1, gpus=8, cpus=8, usd_per_hour=36.0)


def record_in(state: JobState = JobState.PENDING) -> lc.Record:
    job = JobStatus(id="ab12", state=state, spec=JobSpec(), created_at=NOW,
                    plan=None)
    return lc.Record(job)


def run(**changes: Any) -> lc.Run:
    return lc.Run(**{"demand": {"CPU": 2.0}, "launched_at": NOW, "usd_per_hour": 36.0,
                     "nodes_at_launch": frozenset({"n1"}), "describe": "1 x gpu-spot",
                     **changes})


def decision(action: str = "start", interval_s: float | None = None) -> DecisionRecord:
    return DecisionRecord(time=NOW, event="submit", action=action, reason="cheapest",
                          offer=None if interval_s is None else "aws/r/g", market="spot",
                          checkpoint_interval_s=interval_s)


def drive(record: lc.Record, *events: lc.Event, at: float = NOW) -> tuple[lc.Record, list]:
    effects: list = []
    for event in events:
        out = lc.step(record, event, at)
        record, effects = out.record, effects + list(out.effects)
    return record, effects


def kinds(effects: list) -> list[str]:
    return [e.kind if isinstance(e, lc.Emit) else type(e).__name__ for e in effects]


def test_a_job_on_bought_nodes_is_billed_for_as_long_as_it_holds_them() -> None:
    record, effects = drive(record_in(), lc.Submitted(),
                            lc.CapacityDecided(decision(interval_s=600.0), BOUGHT,
                                               "requested 1 x gpu-spot"),
                            lc.Launched(run()), lc.NodesHeld(frozenset({"n1"}), 36.0),
                            lc.GroupStarted(0, "pg-1"))
    assert record.status.state == JobState.RUNNING
    assert record.status.resources == BOUGHT and len(record.status.decisions) == 1
    assert kinds(effects).count("state") == 4 and kinds(effects)[-1] == "Save"
    half_hour = lc.step(record, lc.ProgressReported(1, {"step": 5}), NOW + 1800)
    # Rank 0 is told the policy's checkpoint interval for the capacity it holds.
    assert half_hour.reply == {"stop": False, "move": False, "checkpoint_every_s": 600.0}
    assert half_hour.record.status.cost_usd == pytest.approx(18.0)
    assert half_hour.record.status.progress.step == 5
    ended = lc.step(half_hour.record, lc.CancelRequested(), NOW + 3600)
    assert ended.record.status.cost_usd == pytest.approx(36.0)
    assert kinds(list(ended.effects)) == ["state", "ReleaseNodes", "end", "Save"]
    assert ended.record.run is not None and ended.record.run.stop_by == NOW + 3600 + \
        lc.CANCEL_GRACE_S  # it keeps its capacity counted until the group is gone
    overdue = lc.step(ended.record, lc.StopOverdue(), NOW + 4000)
    assert overdue.effects == (lc.StopRunner(hard=True, placement_group="pg-1"),)
    assert overdue.record.run is None and overdue.record.status.cost_usd == pytest.approx(36.0)


def test_a_notice_is_a_preemption_with_its_cost_and_the_noticed_nodes_are_avoided() -> None:
    record, _ = drive(record_in(), lc.Submitted(), lc.Launched(run()),
                      lc.GroupStarted(0, "pg-1"), lc.ProgressReported(1, {"step": 40}),
                      lc.CheckpointCommitted(1, 30, "/c/30"),
                      lc.FinalReport(1, {"preempted": True, "steps": 41,
                                         "noticed_at": NOW + 1, "checkpointed_at": NOW + 4}))
    out = lc.step(record, lc.RunEnded(None, frozenset({"n1"})), NOW + 10)
    job = out.record.status
    assert job.state == JobState.RECOVERING and job.preemptions == 1 and job.lost_steps == 11
    assert job.preemption_log[0].notice and job.preemption_log[0].notice_to_checkpoint_s == 3
    assert lc.Rebuy(frozenset({"n1"})) in out.effects and lc.StopRunner() in out.effects
    assert out.record.leaving == (NOW + 10 + lc.NOTICE_GRACE_S, frozenset({"n1"}))
    assert lc.noticed_nodes_present(out.record, NOW + 20, frozenset({"n1", "n2"}))
    assert not lc.noticed_nodes_present(out.record, NOW + 20, frozenset({"n2"}))
    # it resumes elsewhere: the downtime and the redone steps are priced
    record, _ = drive(out.record, lc.Launched(run(nodes_at_launch=frozenset({"n2"}),
                                                 launched_at=NOW + 100)),
                      lc.GroupStarted(30, "pg-2"), at=NOW + 100)
    assert record.status.state == JobState.RECOVERING
    resumed = lc.step(record, lc.ProgressReported(1, {"step": 31}), NOW + 130)
    last = resumed.record.status.preemption_log[-1]
    assert resumed.record.status.state == JobState.RUNNING
    assert last.down_s == 120 and last.capacity_to_first_step_s == 30


def test_a_job_that_reaches_its_budget_checkpoints_stops_and_fails_saying_so() -> None:
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(), BOUGHT, "requested 1 x gpu-spot"),
                      lc.Launched(run(budget_usd=20.0)), lc.NodesHeld(frozenset({"n1"}), 36.0),
                      lc.GroupStarted(0, "pg-1"))
    under = lc.step(record, lc.ProgressReported(1, {"step": 5}), NOW + 1800)  # $18
    assert under.reply == {"stop": False, "move": False, "checkpoint_every_s": None}
    over = lc.step(under.record, lc.ProgressReported(1, {"step": 6}), NOW + 2100)  # $21
    assert over.reply == {"stop": False, "move": True}  # checkpoint at the next step, stop
    record, _ = drive(over.record, lc.CheckpointCommitted(1, 7, "/c/7"),
                      lc.FinalReport(1, {"preempted": True, "steps": 7}), at=NOW + 2110)
    out = lc.step(record, lc.RunEnded(None, frozenset({"n1"})), NOW + 2120)
    job = out.record.status
    assert job.state == JobState.FAILED and job.restarts == 0 and job.preemptions == 0
    assert "budget reached" in job.error and "step 7" in job.error
    assert job.checkpoint is not None and job.checkpoint.step == 7
    assert lc.ReleaseNodes() in out.effects and lc.Rebuy(frozenset({"n1"})) not in out.effects


def test_an_error_is_retried_once_after_the_first_step_and_never_twice_the_same() -> None:
    spec = JobSpec.model_validate({"training": {"max_restarts": 5}})
    start = lc.Record(JobStatus(id="ab12", state=JobState.PENDING, spec=spec, created_at=NOW))
    record, _ = drive(start, lc.Submitted(), lc.Launched(run(nodes_at_launch=frozenset())),
                      lc.GroupStarted(0), lc.ProgressReported(1, {"step": 7}))
    retried = lc.step(record, lc.RunEnded("training failed: nan"), NOW).record
    assert retried.status.state == JobState.RECOVERING and retried.status.restarts == 1
    record, _ = drive(retried, lc.Launched(run(nodes_at_launch=frozenset())),
                      lc.GroupStarted(0), lc.ProgressReported(1, {"step": 7}))
    failed = lc.step(record, lc.RunEnded("training failed: nan"), NOW).record
    assert failed.status.state == JobState.FAILED and "nan" in (failed.status.error or "")
    started, _ = drive(start, lc.Submitted(), lc.Launched(run()), lc.GroupStarted(0))
    before_first = lc.step(started, lc.RunEnded("no data", frozenset({"n1"})), NOW)
    assert before_first.record.status.state == JobState.FAILED
    assert lc.ReleaseNodes() in before_first.effects


def test_reports_from_a_run_no_longer_tracked_change_nothing() -> None:
    record, _ = drive(record_in(), lc.Submitted(), lc.Launched(run()), lc.GroupStarted(0))
    stale = lc.step(record, lc.ProgressReported(7, {"step": 3}), NOW)
    assert stale.reply == {"stop": True} and stale.record.status.progress.step == 0
    assert lc.step(record_in(), lc.GroupStarted(0), NOW).reply == -1
    assert lc.step(record, lc.CheckpointCommitted(9, 5, "/x"), NOW).record.status.checkpoint \
        is None


_ATTEMPT = st.integers(1, 2)
EVENTS = st.one_of(
    st.builds(lc.Queued, st.sampled_from(["queued, position 1", "queued, position 2"])),
    st.just(lc.Passed()),
    st.builds(lc.CapacityDecided, st.just(decision()), st.sampled_from([None, BOUGHT]),
              st.sampled_from(["requested", "no capacity to buy"])),
    st.builds(lc.Launched, st.builds(run, usd_per_hour=st.sampled_from([0.0, 3.0]))),
    st.builds(lc.GroupStarted, st.integers(0, 50), st.sampled_from([None, "pg"])),
    st.builds(lc.ProgressReported, _ATTEMPT, st.fixed_dictionaries({"step": st.integers(0, 60)})),
    st.builds(lc.CheckpointCommitted, _ATTEMPT, st.integers(0, 60), st.just("/c")),
    st.builds(lc.FinalReport, _ATTEMPT, st.sampled_from([
        {"preempted": True, "steps": 20},
        {"first_loss": 5.0, "final_loss": 4.0, "steps": 60, "train_wall_s": 1.0,
         "tokens_per_s": 1.0}])),
    st.builds(lc.RunEnded, st.sampled_from([None, "boom"]),
              st.sampled_from([frozenset(), frozenset({"n1"})])),
    st.sampled_from([lc.StopOverdue(), lc.CancelRequested(), lc.Reviewed(),
                     lc.ServiceRestarted(), lc.ServiceStopping()]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(EVENTS, st.floats(0, 600)), max_size=30))
def test_random_event_sequences_keep_the_lifecycles_promises(
        events: list[tuple[lc.Event, float]]) -> None:
    record = lc.step(record_in(), lc.Submitted(), NOW).record
    now, ends = NOW, 0
    for event, elapsed in events:
        now += elapsed
        before = record.status.model_dump()
        try:
            out = lc.step(record, event, now)
        except IllegalTransition:  # only a cancel of an ended job; the manager answers 409
            assert isinstance(event, lc.CancelRequested) and record.status.state in ENDS
            continue
        assert record.status.model_dump() == before, "step changed its input"
        old, new = record.status, out.record.status
        said = [e.data["state"] for e in out.effects
                if isinstance(e, lc.Emit) and e.kind == "state"]
        if new.state != old.state:
            assert new.state in TRANSITIONS[old.state]
            # the stream never skips a state (a restart replays the record instead)
            assert said and said[-1] == new.state.value or isinstance(event,
                                                                      lc.ServiceRestarted)
            assert lc.Save() in out.effects
        assert all(JobState(s) in TRANSITIONS[old.state] | {old.state} for s in said[:1])
        assert new.cost_usd >= old.cost_usd and new.lost_steps >= old.lost_steps >= 0
        assert all(p.lost_steps >= 0 for p in new.preemption_log)
        ends += sum(1 for e in out.effects if isinstance(e, lc.Emit) and e.kind == "end")
        if old.state in ENDS:
            assert new.state == old.state
        record = out.record
    assert ends == (1 if record.status.state in ENDS else 0)


def test_a_review_that_stays_with_a_new_interval_records_it_and_tells_rank_0() -> None:
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(interval_s=600.0), BOUGHT, "requested"),
                      lc.Launched(run()), lc.GroupStarted(0, "pg-1"))
    stayed = lc.step(record, lc.Reviewed(decision("stay", interval_s=240.0)), NOW + 900)
    assert [d.action for d in stayed.record.status.decisions] == ["start", "stay"]
    assert stayed.record.run.moving_to is None and any(isinstance(e, lc.Save)
                                                       for e in stayed.effects)
    reply = lc.step(stayed.record, lc.ProgressReported(1, {"step": 9}), NOW + 901).reply
    assert reply == {"stop": False, "move": False, "checkpoint_every_s": 240.0}
    # On capacity without preemption risk there is no interval: the job's own steps.
    on_demand = decision("switch").model_copy(update={"offer": "aws/r/g",
                                                      "market": "on-demand"})
    moved = lc.step(stayed.record, lc.Reviewed(on_demand, BOUGHT, "1 x gpu-on-demand"),
                    NOW + 1800)
    assert lc.step(moved.record, lc.ProgressReported(1, {"step": 12}),
                   NOW + 1801).reply["checkpoint_every_s"] is None


def test_an_elastic_run_loses_a_group_trains_on_and_the_replacement_joins() -> None:
    """A notice for group 1's node: its replacement is bought at once (Replace 1); the group
    leaves (one preemption, on that group, nothing redone); the others train on, RUNNING;
    group 3 is lost without a notice and its replacement is asked for at once too; group 1's
    replacement heals (its worker group holds its node: only group 3's is still asked for)
    and joins, and the record says when."""
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(interval_s=600.0), BOUGHT, "requested"),
                      lc.Launched(run(groups=4)), lc.GroupStarted(0, "pg-1"))
    assert [g.state for g in record.status.groups] == ["training"] * 4
    out = lc.step(record, lc.GroupChanged(1, 1, "leaving", frozenset({"n2"}), 40), NOW + 10)
    assert lc.Replace(leaving=1) in out.effects
    assert out.record.status.groups[1].state == "leaving"
    assert out.record.run.noticed_nodes == {"n2"}  # no replacement is placed there
    out = lc.step(out.record, lc.GroupChanged(1, 1, "gone", step=41, notice=True,
                                              stall_s=2.0), NOW + 12)
    job = out.record.status
    assert job.state == JobState.RUNNING and job.preemptions == 1 and job.lost_steps == 0
    last = job.preemption_log[-1]
    assert (last.group, last.notice, last.survivors, last.stall_s) == (1, True, 3, 2.0)
    assert kinds(list(out.effects)).count("preemption") == 1
    lost = lc.step(out.record, lc.GroupChanged(1, 3, "gone", step=50, redone_steps=1),
                   NOW + 20)  # a second group, without notice: the step in flight redone
    assert lost.record.status.lost_steps == 1 and lost.record.status.preemptions == 2
    # Both replacements asked for now: the noticed node is gone too, the lost one's at once
    # (not when Ray finds its fit dead). Without the lost one's, Replace(0, 1) stays here.
    assert lc.Replace(leaving=0, lost=2) in lost.effects
    healing = lc.step(lost.record, lc.GroupChanged(1, 1, "healing", frozenset({"n9"}), 55),
                      NOW + 60)
    assert lc.Replace(leaving=0, lost=1) in healing.effects  # group 3's still wanted
    joined = lc.step(healing.record, lc.GroupChanged(1, 1, "training", frozenset({"n9"}), 56,
                                                     stall_s=1.0), NOW + 70)
    job = joined.record.status
    assert job.groups[1].state == "training" and job.groups[1].nodes == ["n9"]
    assert job.preemption_log[0].replaced_after_s == 58.0
    assert job.costs.replace_s.measured_s == 58.0 and job.costs.group_stall_s.samples == 2
    assert "n9" in joined.record.run.nodes  # billed as the run's from now
    ended = lc.step(joined.record, lc.RunEnded("ActorDiedError: too few groups",
                                               frozenset({"n1"})), NOW + 80)
    assert ended.record.status.groups == []


def test_a_noticed_group_the_runner_records_first_takes_the_survivors_stall_once() -> None:
    """The runner reports a noticed group gone when its fit ends, which can come before the
    survivors' quorum misses it: one preemption, noticed, nothing redone; the survivors'
    later report adds their stall to it, once (each survivor reports what it sees)."""
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(interval_s=600.0), BOUGHT, "requested"),
                      lc.Launched(run(groups=3)), lc.GroupStarted(0, "pg-1"))
    out = lc.step(record, lc.GroupChanged(1, 1, "leaving", frozenset({"n2"}), 40), NOW + 10)
    runner = lc.step(out.record, lc.GroupChanged(1, 1, "gone", step=41, notice=True),
                     NOW + 11)
    [first] = runner.record.status.preemption_log
    assert (first.notice, first.lost_steps, first.stall_s, first.survivors) == (
        True, 0, None, 2)
    survivor = lc.step(runner.record, lc.GroupChanged(1, 1, "gone", step=42, stall_s=3.0),
                       NOW + 13)
    other = lc.step(survivor.record, lc.GroupChanged(1, 1, "gone", step=42, stall_s=3.5),
                    NOW + 13)
    job = other.record.status
    assert job.preemptions == 1 and len(job.preemption_log) == 1
    assert job.preemption_log[0].stall_s == 3.0 and job.costs.group_stall_s.samples == 1
    assert job.preemption_log[0].notice and job.lost_steps == 0


def test_a_groups_notice_told_after_a_survivor_saw_it_go_still_counts_as_a_notice() -> None:
    """The leaving group's "leaving" and a survivor's "gone" come from different processes;
    when "gone" arrives first, the later "leaving" marks that preemption as noticed (and buys
    the replacement), and the group stays gone."""
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(interval_s=600.0), BOUGHT, "requested"),
                      lc.Launched(run(groups=2)), lc.GroupStarted(0, "pg-1"))
    gone = lc.step(record, lc.GroupChanged(1, 1, "gone", step=41, stall_s=2.0), NOW + 12)
    assert not gone.record.status.preemption_log[-1].notice
    told = lc.step(gone.record, lc.GroupChanged(1, 1, "leaving", frozenset({"n2"}), 40),
                   NOW + 13)
    job = told.record.status
    assert job.groups[1].state == "gone" and job.preemptions == 1
    assert job.preemption_log[-1].notice and job.lost_steps == 0
    assert lc.Replace(leaving=1) in told.effects
    assert told.record.run.noticed_nodes == {"n2"}


def test_a_durable_checkpoint_that_grows_old_is_a_warning_until_the_next_commits() -> None:
    """The policy checkpoints every 600 s; with the uploads failing, a report 3 intervals
    after the last commit carries a warning, and the next commit clears it."""
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(interval_s=600.0), BOUGHT, "requested"),
                      lc.Launched(run()), lc.GroupStarted(0, "pg-1"),
                      lc.CheckpointCommitted(1, 10, "s3://b/ab12/checkpoints/step_10", 0.5, 9.0))
    assert record.status.checkpoint.committed_at == NOW
    assert record.status.checkpoint.durable_s == 9.0
    fresh = lc.step(record, lc.ProgressReported(1, {"step": 20}), NOW + 1700)
    assert fresh.record.status.warning is None
    stale = lc.step(fresh.record, lc.ProgressReported(1, {"step": 40}), NOW + 1801)
    assert "step 10" in stale.record.status.warning and "30 min old" in \
        stale.record.status.warning and lc.Save() in stale.effects
    again = lc.step(stale.record, lc.CheckpointCommitted(1, 40, "s3://b/step_40"), NOW + 1900)
    assert again.record.status.warning is None


def test_a_status_never_shows_a_step_below_its_checkpoint() -> None:
    """A checkpoint taken after the last progress report (a notice's, between two reports):
    while the job recovers, its status shows the checkpoint's step, not the older report's."""
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(), BOUGHT, "requested"),
                      lc.Launched(run()), lc.GroupStarted(0, "pg-1"),
                      lc.ProgressReported(1, {"step": 12}),
                      lc.CheckpointCommitted(1, 20, "/c/20"))
    assert record.status.checkpoint.step == 20 and record.status.progress.step == 20
    later = lc.step(record, lc.ProgressReported(1, {"step": 25}), NOW + 1)
    assert later.record.status.progress.step == 25


def test_a_restarted_service_bills_a_job_to_the_cent_of_an_uninterrupted_one() -> None:
    """The bill is saved with the record (status.bill): a service lost 500 s after its last
    save and restarted bills the nodes the job held through the loss, as the cloud does.
    (With the bill in memory only, the restarted one billed from the last shown cost, 5 of
    the 30 dollars short; and it never let the figure go down with a max().)"""
    record, _ = drive(record_in(), lc.Submitted(),
                      lc.CapacityDecided(decision(), BOUGHT, "requested 1 x gpu-spot"),
                      lc.Launched(run()), lc.NodesHeld(frozenset({"n1"}), 36.0),
                      lc.GroupStarted(0, "pg-1"))
    saved = lc.step(record, lc.ProgressReported(1, {"step": 5}), NOW + 1000).record
    uninterrupted = lc.step(saved, lc.ProgressReported(1, {"step": 9}), NOW + 3000).record
    assert uninterrupted.status.cost_usd == pytest.approx(30.0, abs=1e-9)
    # The service is lost at NOW + 1500, its last save NOW + 1000; a new one reads the store.
    reloaded = lc.Record(JobStatus.model_validate_json(saved.status.model_dump_json()))
    assert reloaded.held == {"n1": (NOW, 36.0)}
    restarted, _ = drive(reloaded, lc.ServiceRestarted(), at=NOW + 1500)
    assert restarted.status.cost_usd == pytest.approx(15.0, abs=1e-9)  # through the loss
    # Its placement finds the node again and the job trains on there.
    again, _ = drive(restarted, lc.Launched(run(launched_at=NOW + 1500)),
                     lc.NodesHeld(frozenset({"n1"}), 36.0), at=NOW + 1500)
    later = lc.step(again, lc.GroupStarted(0, "pg-2"), NOW + 3000).record
    later = lc.step(later, lc.ProgressReported(later.run.attempt if later.run else 1,
                                               {"step": 9}), NOW + 3000).record
    assert later.status.cost_usd == pytest.approx(uninterrupted.status.cost_usd, abs=1e-9)
    # An older store's record (no bill kept): what it cost so far stays, closed.
    old = saved.status.model_dump(mode="json")
    del old["bill"]
    assert JobStatus.model_validate(old).bill.closed_usd == saved.status.cost_usd
