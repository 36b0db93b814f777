"""Jobs that could never run are refused at submit, with the capacity named: on a fixed
cluster by its nodes, on an autoscaling one by the node types the service may buy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from raytrain.core.queue import never_fits
from raytrain.serve.jobs.provisioning import Provisioner
from raytrain.spec import ServiceConfig, parse_job_spec

ROOT = Path(__file__).resolve().parents[2]


def test_a_worker_group_that_can_never_fit_a_fixed_cluster_is_named() -> None:
    two_cpus = [{"CPU": 2.0}]
    assert never_fits(2, {"CPU": 1.0, "GPU": 0.0}, two_cpus) is None
    assert never_fits(4, {"CPU": 0.5}, two_cpus) is None
    assert "room for 2" in never_fits(4, {"CPU": 1.0}, two_cpus)
    assert "room for 0" in never_fits(1, {"CPU": 9.9e78}, two_cpus)
    assert "room for 0" in never_fits(1, {"CPU": 1.0, "GPU": 1.0}, two_cpus)
    # each worker fits on one node whole: two 1.5-CPU nodes hold two 1.5-CPU workers, not 3
    assert "room for 2" in never_fits(3, {"CPU": 1.5}, [{"CPU": 1.5}, {"CPU": 1.5}, {"CPU": 1}])


def small_job(**resources: Any) -> dict[str, Any]:
    return {"model": {"gpt": {"vocab_size": 128, "dim": 64, "num_layers": 2, "num_heads": 4,
                              "max_seq_len": 32}},
            "data": {"seq_len": 32},
            "training": {"steps": 60, "global_batch_size": 64, "micro_batch_size": 4},
            "resources": {"num_workers": 2, "cpus_per_worker": 1, **resources}}


def test_a_job_no_bought_node_type_can_hold_is_named() -> None:
    service = yaml.safe_load((ROOT / "cluster" / "local-fake-service.yaml").read_text())
    service["offers_file"] = str(ROOT / "cluster" / service["offers_file"])
    provisioner = Provisioner(ServiceConfig.model_validate(service), request=lambda *_: None)
    assert provisioner.holding_error(parse_job_spec(small_job())) is None
    too_many = provisioner.holding_error(parse_job_spec(small_job(num_workers=16)))
    assert too_many is not None and "cpu-spot" in too_many.msg and "To fix" in too_many.msg
    gpus = provisioner.holding_error(parse_job_spec(small_job(gpus_per_worker=1,
                                                               accelerator="h100-sxm")))
    assert gpus is not None and "no offer has GPU nodes" in gpus.msg


def test_a_small_job_passes_a_waiting_big_one_a_bounded_number_of_times() -> None:
    from raytrain.core.queue import Queued, backfill

    total = {"CPU": 2.0}
    running = [{"CPU": 1.0}]  # one CPU free
    queue = [Queued("big", {"CPU": 2.0}), Queued("small", {"CPU": 1.0}),
             Queued("after", {"CPU": 1.0})]
    first = backfill(queue, total, running, max_passed=2)
    assert first.start == ("small",) and first.passed == ("big",)
    assert "waiting for 2 CPU" in first.waiting["big"]
    assert "position 3 of 3" in first.waiting["after"]
    # passed twice already: nothing may start ahead of it any more
    starved = [Queued("big", {"CPU": 2.0}, passed=2), Queued("small", {"CPU": 1.0})]
    held_back = backfill(starved, total, running, max_passed=2)
    assert held_back.start == () and "passed 2 times" in held_back.waiting["small"]
    assert backfill(starved, total, [], max_passed=2).start == ("big",)
    # 0: strictly first in, first out
    assert backfill(queue, total, running, max_passed=0).start == ()


@given(st.lists(st.integers(1, 2), min_size=1, max_size=8), st.integers(0, 3))
def test_the_oldest_waiting_job_starts_after_at_most_max_passed_others(
    sizes: list[int], max_passed: int
) -> None:
    """Jobs of 1 or 2 CPUs on 2 CPUs, each running for one pass: the first job in the queue
    starts within max_passed + 1 passes of the queue."""
    from raytrain.core.queue import Queued, backfill

    queue = [Queued(f"j{i}", {"CPU": float(size)}) for i, size in enumerate(sizes)]
    oldest = queue[0].job_id
    held: list[dict[str, float]] = [{"CPU": 1.0}]  # something runs when we start
    for _ in range(max_passed + 2):
        decided = backfill(queue, {"CPU": 2.0}, held, max_passed)
        if oldest in decided.start:
            return
        passed = set(decided.passed)
        queue = [Queued(q.job_id, q.demand, q.passed + (q.job_id in passed))
                 for q in queue if q.job_id not in decided.start]
        held = []  # whatever ran finishes before the next pass
    raise AssertionError(f"{oldest} never started")
