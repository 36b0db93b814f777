"""Which jobs train on in replica groups (raytrain.core.elastic): the layout's replicas, when
the job allows it, they span two nodes or more and groups hold whole nodes (or nodes whole
groups); a group may hold a whole pipeline, save an interleaved one. And how the groups
alive share a step: every unit once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raytrain.core.elastic import elastic_groups, share_of_step
from raytrain.spec import JobSpec
from raytrain.spec.layout import Layout
from tests.support.service import small_job


def spec(elastic: bool = True, min_groups: int = 1) -> JobSpec:
    job = small_job()
    return JobSpec.model_validate({**job, "parallel": {**job.get("parallel", {}),
                                                       "elastic": elastic,
                                                       "min_replica_groups": min_groups}})


def test_replicas_are_groups_when_the_job_allows_it_and_they_hold_whole_nodes() -> None:
    four = Layout(dp_replicate=4)
    assert elastic_groups(spec(), four, nodes=4) == 4
    assert elastic_groups(spec(), four, nodes=2) == 4  # two groups a node
    assert elastic_groups(spec(), four, nodes=3) == 1  # a group across two nodes
    assert elastic_groups(spec(), four, nodes=1) == 1  # one node: lost whole or not at all
    assert elastic_groups(spec(elastic=False), four, nodes=4) == 1
    assert elastic_groups(spec(min_groups=4), four, nodes=4) == 1  # none may be lost


def test_a_group_may_hold_a_whole_pipeline_but_not_an_interleaved_one() -> None:
    """raytrain.parallel.pipeline runs a schedule for each count of micro-batches a group's
    share comes to; torch builds an interleaved schedule only for some counts."""
    assert elastic_groups(spec(), Layout(dp_replicate=2, pp=2, schedule="1f1b"), 2) == 2
    assert elastic_groups(spec(), Layout(dp_replicate=2, pp=2, schedule="gpipe"), 2) == 2
    assert elastic_groups(spec(), Layout(dp_replicate=2, pp=2, virtual_stages=2,
                                         schedule="interleaved_1f1b"), 2) == 1


@given(st.integers(0, 64), st.integers(1, 9))
def test_the_groups_alive_run_every_unit_of_a_step_once(units: int, alive: int) -> None:
    shares = [share_of_step(units, alive, rank) for rank in range(alive)]
    assert sorted(u for share in shares for u in share) == list(range(units))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_torchft_logs_no_line_per_step_and_a_change_of_membership_is_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """torchft's INFO lines (quorum, commit, heal: one per rank per step) are kept out of a
    group's log; what the group logs instead is a line when the groups in the quorum change."""
    import logging

    import torch

    from raytrain.train.replica_group import GroupEvents, _report_members, quiet_torchft

    quiet_torchft()
    caplog.set_level(logging.INFO)
    for name in ("torchft.manager", "torchft_quorums", "torchft_commits"):
        logging.getLogger(name).info("quorum for step 7")
    assert "quorum for step 7" not in caplog.text
    flags = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0])
    members = None
    for step in range(5):
        members = _report_members(GroupEvents(), members, flags, 2, step, 0, 0.0, 0.0)
    flags[4] = 0.0
    members = _report_members(GroupEvents(), members, flags, 2, 5, 0, 0.0, 0.0)
    assert caplog.text.count("in the quorum") == 2
