"""cluster.yaml: Ray's own schema, the checks it misses, and the node types it binds to offers;
the provisioner's requests to the autoscaler for a job, with the request function recorded."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from raytrain.cloud.cluster_configs import (
    check_cluster_config,
    node_type_bindings,
    validate_with_ray,
)
from raytrain.errors import SpecError
from raytrain.serve.jobs.provisioning import Provisioner
from raytrain.spec import JobSpec, JobState, JobStatus, ServiceConfig
from raytrain.spec.files import snapshot
from raytrain.testing.jobs import gpt_1b_job

REPO = Path(__file__).resolve().parents[2]
CLUSTER = yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_the_shipped_cluster_configs_pass_rays_schema_and_ours() -> None:
    validate_with_ray(CLUSTER)
    assert check_cluster_config(CLUSTER, snapshot()) == []
    bindings = node_type_bindings(CLUSTER, snapshot())
    assert {name: (b.offer, b.market) for name, b in bindings.items()} == {
        "p5-spot": ("aws/us-east-1/p5.48xlarge", "spot"),
        "p5-on-demand": ("aws/us-east-1/p5.48xlarge", "on-demand"),
        "g6e-spot": ("aws/us-east-1/g6e.12xlarge", "spot"),
        "g6e-on-demand": ("aws/us-east-1/g6e.12xlarge", "on-demand"),
    }
    fake = yaml.safe_load((REPO / "cluster/local-fake.yaml").read_text())
    validate_with_ray(fake, fill_defaults=False)
    assert check_cluster_config(fake, snapshot()) == []


def _broken(change: Any) -> dict[str, Any]:
    document = copy.deepcopy(CLUSTER)
    change(document)
    return document


@pytest.mark.parametrize("change, where, says", [
    (lambda d: d["provider"].pop("region"), ("provider", "region"), "needs a region"),
    (lambda d: d["available_node_types"]["p5-spot"].update(min_workers=5),
     ("available_node_types", "p5-spot", "min_workers"), "exceeds max_workers"),
    (lambda d: d["available_node_types"]["g6e-spot"]["node_config"].update(
        InstanceType="g9z.huge"), ("available_node_types", "g6e-spot", "node_config",
                                   "InstanceType"), "not an offer in us-east-1"),
    (lambda d: d["available_node_types"]["p5-on-demand"]["node_config"].update(
        instanceType=d["available_node_types"]["p5-on-demand"]["node_config"].pop(
            "InstanceType")), ("available_node_types", "p5-on-demand", "node_config",
                               "instanceType"), "misspelt"),
    (lambda d: d["available_node_types"]["p5-spot"].update(resources={"GPU": 8}),
     ("available_node_types", "p5-spot", "resources"), "custom resource 'p5-spot'"),
    (lambda d: d["available_node_types"]["p5-spot"]["node_config"].update(
        InstanceMarketOptions={"MarketType": "capacity-block"}),
     ("available_node_types", "p5-spot", "node_config", "InstanceMarketOptions"), "spot"),
])
def test_what_rays_schema_lets_through_is_caught(change: Any, where: tuple[str, ...],
                                                 says: str) -> None:
    document = _broken(change)
    problems = check_cluster_config(document, snapshot())
    assert [p.loc for p in problems] == [where] and says in problems[0].msg
    with pytest.raises(SpecError):
        node_type_bindings(document, snapshot())


def test_rays_schema_catches_what_it_knows() -> None:
    with pytest.raises(Exception, match="max_wrkers|Additional properties"):
        validate_with_ray(_broken(lambda d: d.update(max_wrkers=3)))


def _job(spec: dict[str, Any]) -> JobStatus:
    return JobStatus(id="j1", state=JobState.PENDING, spec=JobSpec.model_validate(spec),
                     created_at=time.time())


def test_the_provisioner_requests_the_chosen_node_type_and_moves_when_it_does_not_come(
) -> None:
    sent: list[tuple[str, list[dict[str, float]]]] = []
    config = ServiceConfig(node_types=node_type_bindings(CLUSTER, snapshot()))
    provisioner = Provisioner(config, request=lambda job_id, bundles: sent.append(
        (job_id, bundles)))
    job = _job(gpt_1b_job("h100-sxm", parallel={"strategy": "auto"},
                          capacity={"policy": "cost-first"}))
    placement, decided = provisioner.place(job, now=time.time())
    assert placement is not None and decided is not None and decided.resources is not None
    first = decided.decision
    assert placement.node_type in config.node_types and first.action == "start"
    assert sent[-1] == ("j1", [{placement.node_type: 1.0}] * placement.nodes)
    assert placement.worker_resources == {placement.node_type: round(1 / 8 if "p5" in
                                           placement.node_type else 1 / 4, 4)}
    assert placement.spec.resources.num_workers == placement.workers
    assert decided.resources.node_type == placement.node_type
    assert decided.resources.usd_per_hour > 0
    assert job.decisions == [], "the provisioner decides; only the lifecycle changes the job"
    assert provisioner.place(job, now=time.time()) == (placement, None)  # decided once
    # The nodes do not come: that offer and market are off the table for this job.
    moved, decided = provisioner.capacity_missing(job, now=time.time())
    assert moved is not None and (moved.option.offer.id, moved.option.market) != (
        placement.option.offer.id, placement.option.market)
    assert decided is not None and decided.decision.event == "capacity-missing"
    assert sent[-1] == ("j1", [{moved.node_type: 1.0}] * moved.nodes)
    # Once the worker group is up Ray Train's own request holds the nodes; ours is renewed
    # only while it is the one that counts.
    provisioner.handed_over(job.id)
    assert sent[-1] == ("j1", [])
    provisioner.refresh(time.time() + 3600)
    assert sent[-1] == ("j1", [])
    provisioner.release(job.id)
    assert sent[-1] == ("j1", []) and job.id not in provisioner.placements
    with_unknown = _job({"capacity": {"policy": "cheapest-ever"}})
    error = provisioner.policy_error(with_unknown.spec)
    assert error is not None and error.loc == ("capacity", "policy") and "cost-first" in error.msg


def test_the_services_hourly_ceiling_holds_a_job_back_and_refuses_one_that_never_fits(
) -> None:
    sent: list[tuple[str, list[dict[str, float]]]] = []
    bindings = node_type_bindings(CLUSTER, snapshot())
    small = {"training": {"steps": 20000, "global_batch_size": 32},
             "parallel": {"strategy": "data"},
             "resources": {"num_workers": 8, "gpus_per_worker": 1, "accelerator": "h100-sxm"},
             "capacity": {"market": "on-demand"}}
    alone = Provisioner(ServiceConfig(node_types=bindings, max_usd_per_hour=None),
                        request=lambda job_id, bundles: None)
    placed, _ = alone.place(_job(small), now=time.time())
    assert placed is not None
    price = placed.option.usd_per_hour  # one 8-GPU node on demand
    config = ServiceConfig(node_types=bindings, max_usd_per_hour=price * 1.5)
    provisioner = Provisioner(config, request=lambda job_id, bundles: sent.append(
        (job_id, bundles)))
    first, _ = provisioner.place(_job(small), now=time.time())
    second_job = _job(small).model_copy(update={"id": "j2"})
    second, decided = provisioner.place(second_job, now=time.time())
    assert first is not None and second is None and decided is not None
    assert decided.resources is None and "max_usd_per_hour" in decided.decision.reason
    assert not any(job_id == "j2" and bundles for job_id, bundles in sent)  # nothing bought
    provisioner.release("j1")  # the first ends: the second fits under the ceiling now
    second, decided = provisioner.place(second_job, now=time.time())
    assert second is not None and decided.resources.usd_per_hour == pytest.approx(price)
    # A job that alone costs more than the ceiling is refused at submit, naming it.
    tight = Provisioner(ServiceConfig(node_types=bindings, max_usd_per_hour=price / 2),
                        request=lambda job_id, bundles: None)
    error = tight.holding_error(_job(small).spec)
    assert error is not None and "max_usd_per_hour" in error.msg
