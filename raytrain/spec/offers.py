"""Capacity for sale and how to buy it: offers, their catalog, policies, node-type bindings
and the decisions taken."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from raytrain.catalog.hardware import CATALOG_VERSION, CLOUD_NOTICES, LINKS, NO_NOTICE
from raytrain.spec._base import Record, Strict, field_error, raise_if_any
from raytrain.spec.job import JobSpec
from raytrain.spec.resources import Market, accelerator_errors


class Offer(Strict):
    """One instance type one provider rents, with its prices and spot interruption rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = Field(description="aws, or the GPU cloud that rents it.")
    region: str = Field(description="Region the prices are for.")
    spot_zone: str | None = Field(None, description="Zone of the cheapest spot price.")
    instance_type: str = Field(description="The provider's name for the instance type.")
    gpu_kind: str = Field(description="A GPU kind of the hardware catalog.")
    gpus_per_node: int = Field(ge=1, description="GPUs per instance.")
    intra_link: str = Field(description="Link between the GPUs of one node (catalog name).")
    network_gbps: float = Field(gt=0, description="Network bandwidth between nodes, Gbit/s.")
    rdma: bool = Field(False, description="RDMA between nodes (EFA, InfiniBand).")
    on_demand_usd_per_hour: float | None = Field(None, ge=0, description="Per node.")
    spot_usd_per_hour: float | None = Field(None, ge=0, description="Per node; null: no spot.")
    spot_interruptions_per_hour: float = Field(
        0.0, ge=0, description="Expected spot interruptions per node-hour."
    )
    interruption_band: str | None = Field(
        None, description="The provider's published band, e.g. AWS Spot Advisor '>20%' a month."
    )
    max_nodes: int | None = Field(None, ge=1, description=(
        "The most nodes of this offer one job may span (1: its nodes cannot train together, "
        "e.g. GPU-cloud pods joined only by a slow network); null: no limit."))
    notice_s: float | None = Field(None, ge=0, le=3600, description=(
        "Seconds of warning the cloud gives before it takes a spot node back (AWS 120, GCP 30, "
        "RunPod 0); null: the provider's figure (raytrain.catalog.hardware.CLOUD_NOTICES)."))
    notice_share: float | None = Field(None, ge=0, le=1, description=(
        "Share of spot preemptions that come with that notice (AWS and GCP give it on a best "
        "effort basis); null: the provider's figure."))
    spot_joins_cluster: bool = Field(True, description=(
        "Whether this offer's spot nodes can join the Ray cluster, and so take a job. false: "
        "RunPod's interruptible pods, which have no private network to the head (its REST "
        "API v2 has no interruptible pods, and its GraphQL create takes no global "
        "networking): the spot price is shown for comparison, never bought, by the policy "
        "and the simulator alike."))
    note: str = Field("", description="Where the figures come from.")

    @property
    def notice(self) -> tuple[float, float]:
        """(seconds of notice, share of preemptions that get it): the offer's own figures,
        else its provider's."""
        seconds, share, _ = CLOUD_NOTICES.get(self.provider, NO_NOTICE)
        return (seconds if self.notice_s is None else self.notice_s,
                share if self.notice_share is None else self.notice_share)

    @model_validator(mode="after")
    def _known_parts(self) -> Offer:
        errors = accelerator_errors(self.gpu_kind, ("gpu_kind",))
        if self.intra_link not in LINKS:
            errors.append(field_error(("intra_link",), f"unknown link {self.intra_link!r}. "
                                       "To fix: use one of " + ", ".join(sorted(LINKS)),
                                       self.intra_link))
        if self.on_demand_usd_per_hour is None and self.spot_usd_per_hour is None:
            errors.append(field_error(("on_demand_usd_per_hour",), "an offer needs a price. "
                                       "To fix: give on_demand_usd_per_hour or "
                                       "spot_usd_per_hour", None))
        raise_if_any("Offer", errors)
        return self

    @property
    def id(self) -> str:
        return f"{self.provider}/{self.region}/{self.instance_type}"

    def usd_per_hour(self, market: str) -> float | None:
        return self.spot_usd_per_hour if market == "spot" else self.on_demand_usd_per_hour

    def served_by_pods(self) -> Offer:
        """This offer as a pod type serves it (ServiceConfig.pod_types): its spot market
        takes a one-pod job, driven over SSH (raytrain.cloud.pod_runs)."""
        return self.model_copy(update={"spot_joins_cluster": True})

    def markets(self) -> list[str]:
        """The markets a job can be bought in: those with a price, spot only where its nodes
        join the cluster."""
        return [m for m in ("spot", "on-demand") if self.usd_per_hour(m) is not None
                and (m == "on-demand" or self.spot_joins_cluster)]


class OfferCatalog(Record):
    version: str = Field(
        CATALOG_VERSION, description="The catalog these offers belong to (raytrain.catalog: "
        "one version for hardware, offers and policies); fetched_at says when a refresh "
        "updated their prices.")
    source: Literal["snapshot", "aws", "runpod", "aws+runpod", "file"] = Field(
        description="Where the offers came from: the shipped snapshot, a refresh from AWS, "
        "RunPod or both, or an operator's file.")
    fetched_at: float | None = Field(None, description="Unix time of the refresh, if any.")
    warnings: list[str] = Field(default_factory=list, description="What could not be refreshed.")
    offers: list[Offer]

    def find(self, offer_id: str) -> Offer | None:
        return next((o for o in self.offers if o.id == offer_id), None)

    def with_pods(self, offer_ids: set[str]) -> OfferCatalog:
        """The catalog as a service with pod types on `offer_ids` buys it: their spot markets
        take one-pod jobs (Offer.served_by_pods)."""
        return self.model_copy(update={"offers": [
            o.served_by_pods() if o.id in offer_ids else o for o in self.offers]})


class PolicySpec(Strict):
    """A named autoscaling policy (policies/*.yaml): how the service buys capacity."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$", description="The file's stem.")
    description: str = Field(description="One line for `raytrain offers`.")
    markets: list[Market] = Field(
        ["spot", "on-demand"], min_length=1, description="Markets the policy may buy."
    )
    objective: Literal["cost", "time"] = Field(
        "cost", description="Minimise expected dollars to finish, or expected hours."
    )
    deadline_margin: float = Field(
        0.15, ge=0, le=2, description="Plans must finish this fraction before the deadline."
    )
    fallback_slack_s: float = Field(
        1800.0, ge=0, description="A cheaper option that may not finish in time is tried "
        "while the fastest one would still finish this long before the deadline (after the "
        "margin), so the job can fall back to it; 0: only options expected in time."
    )
    failover_after_preemptions: int | None = Field(
        None, ge=1, description="Move to on-demand after this many preemptions; null: never."
    )
    capacity_wait_s: float = Field(
        600.0, gt=0, description="Spot capacity missing this long: take the next best offer "
        "(unless a deadline leaves time in hand beyond fallback_slack_s: then keep waiting)."
    )
    switch_min_saving: float = Field(
        0.2, ge=0, le=1,
        description="Move a running job to a cheaper offer only when the expected cost to "
        "finish falls by this fraction (and by more than the move costs).",
    )
    checkpoint_interval_s: float | None = Field(
        None, gt=0, description="Seconds between periodic checkpoints; null: Young/Daly optimum."
    )
    max_checkpoint_interval_s: float = Field(
        3600.0, gt=0, description="Checkpoint at least this often, whatever the optimum says "
        "(it trusts a rate measured over few preemptions)."
    )
    checkpoint_cost_s: float = Field(
        60.0, gt=0, description="Assumed seconds one checkpoint stalls training, until the job "
        "has measured one (its status shows which is used)."
    )
    restart_s: float = Field(
        300.0, ge=0, description="Assumed seconds from capacity in hand to the first training "
        "step, until the job has measured one."
    )
    ready_s: float = Field(
        180.0, ge=0, description="Assumed seconds from asking for a node to the node being up, "
        "until the service has measured it for the offer."
    )
    group_stall_s: float = Field(
        5.0, ge=0, description="Elastic jobs: assumed seconds the surviving replica groups "
        "stall when one leaves or joins, until measured."
    )
    capacity_retry_s: float = Field(
        1800.0, gt=0, description="Capacity found missing is tried again after this long (a "
        "market that was empty is not empty for good)."
    )
    max_regret: float | None = Field(
        0.1, ge=0, le=10, description="A job never pays more than on-demand would have from "
        "its start by more than this fraction: spot is held only while the money spent, its "
        "worst case until the next decision and on-demand to the end stay under the cap; null: "
        "no cap."
    )
    regret_floor_usd: float = Field(
        1.0, ge=0, description="The regret cap is at least this many dollars over on-demand: "
        "for a job worth cents, a tenth of it is not worth giving up spot for."
    )
    max_nodes: int = Field(16, ge=1, le=4096, description="Most nodes one job may hold.")
    prior_node_hours: float = Field(
        20.0, gt=0, description="Weight of the catalog's interruption rate against preemptions "
        "observed, in node-hours.",
    )

    @model_validator(mode="after")
    def _failover_needs_both(self) -> PolicySpec:
        if self.failover_after_preemptions is not None and self.markets != ["spot", "on-demand"]:
            raise_if_any("PolicySpec", [field_error(
                ("failover_after_preemptions",),
                "failing over to on-demand needs markets [spot, on-demand]. To fix: list both "
                "markets or drop failover_after_preemptions", self.failover_after_preemptions)])
        return self


class ResumeRequest(Strict):
    """POST /v1/jobs/{id}/resume: go on from a failed or cancelled job's latest checkpoint."""

    budget_usd: float | None = Field(None, gt=0, description="The new job's own budget in "
                                     "dollars; default: the old job's.")


class ExportRequest(Strict):
    """POST /v1/jobs/{id}/export: a kind 'hf' job's checkpoint as a Hugging Face folder."""

    step: int | None = Field(None, ge=1, description="The checkpoint's step; default: the "
                             "latest.")
    merge: bool = Field(False, description="A training.lora job: its adapter folded into the "
                        "weights (a whole model's folder), not the adapter as a PEFT folder.")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(None, description=(
        "The dtype the weights are written in; default: the one the source folder's "
        "config.json states (as save_pretrained writes), float32 if none."))


class ExportAnswer(Strict):
    """Where the export was written: `<the job's storage>/exports/step_<N>`."""

    job_id: str
    step: int = Field(description="The checkpoint's step.")
    path: str = Field(description="The Hugging Face folder: a folder, or an s3:// prefix.")


class OffersRequest(Strict):
    """POST /v1/offers: rank the offers for a job that has not been submitted."""

    spec: JobSpec = Field(description="The job to rank offers for.")
    policy: str | None = Field(None, description="Policy name; default: the job's, else the "
                               "service's.")
    keep: int = Field(20, ge=1, le=500, description="How many options to return.")


class OfferRow(Record):
    """One option of the policy's ranking: an offer, a market and a node count for a job."""

    rank: int = Field(description="Place in the ranking, from 1 (the policy's choice).")
    offer: str = Field(description="The offer's id (provider/region/type).")
    instance_type: str = Field(description="The provider's name for the machine.")
    gpu_kind: str = Field(description="The accelerator kind, as the catalog names it.")
    market: Market = Field(description="spot or on-demand.")
    nodes: int = Field(description="Machines bought.")
    gpus: int = Field(description="Devices on those machines, in all.")
    usd_per_hour: float = Field(description="Hourly price of all the nodes.")
    tokens_per_s: float = Field(description="The planner's throughput on them.")
    layout: str = Field(description="The layout the job would train with there.")
    preemptions_per_hour: float = Field(
        description="Expected preemptions per hour of all the nodes (0 on-demand).")
    checkpoint_interval_s: float | None = Field(
        description="Checkpoint interval the policy would use (null: the job's own).")
    expected_hours: float = Field(
        description="Expected hours to finish, counting redone work and restarts.")
    expected_cost_usd: float = Field(description="Expected dollars to finish.")


class ObservedRate(Record):
    """One offer's spot interruptions: the catalog's prior, what this service saw, and the
    estimate the policy ranks with (the prior updated by what was seen)."""

    offer: str = Field(description="The offer's id.")
    prior_per_node_hour: float = Field(description="The catalog's rate, per node-hour.")
    preemptions: int = Field(description="Spot preemptions this service has seen there.")
    spot_node_hours: float = Field(description="Spot node-hours held there when they struck.")
    estimate_per_node_hour: float = Field(description="The rate the policy uses now.")


class OffersResponse(Record):
    """The catalog, and with a job the policy's ranking for it."""

    catalog_version: str = Field(description="Version of the hardware catalog.")
    source: str = Field(description="Where the prices came from (a file, or the cloud's API "
                        "and when).")
    warnings: list[str] = Field(description="Prices that are stale or fell back offline.")
    offers: list[Offer] = Field(description="Every offer the service can buy.")
    policy: str | None = Field(None, description="The policy that ranked, with a job.")
    ranking: list[OfferRow] = Field(default_factory=list, description=(
        "Offer x market x node count for the job, best first (empty without a job)."))
    decision: str | None = Field(None, description="What the policy would do, and why.")
    observed: list[ObservedRate] = Field(default_factory=list, description=(
        "Each spot offer's interruption rate: prior, seen, and the policy's estimate."))


class NodeTypeBinding(Strict):
    offer: str = Field(description="Id of the offer the node type buys (provider/region/type).")
    market: Market = Field(description="spot or on-demand.")
    max_nodes: int = Field(0, ge=0, description="The node type's max_workers; 0: no limit.")


class PodType(Strict):
    """A node type served by RunPod interruptible pods that join no cluster: one pod a job,
    rented by the service and driven over its public SSH (raytrain.cloud.pod_runs)."""

    gpu_type_id: str = Field(max_length=200, description="RunPod's GPU type id, e.g. 'NVIDIA "
                             "GeForce RTX 4090'.")
    gpu_count: int = Field(1, ge=1, le=8, description="GPUs of the pod (its offer's).")
    cpus: float = Field(8.0, gt=0, description="CPUs the pod gives the job's ranks.")
    image: str = Field("runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04",
                       max_length=500, description="The pod's image (one of RunPod's: it "
                       "starts sshd with PUBLIC_KEY).")
    disk_gb: int = Field(50, ge=1, le=10_000, description="Container disk, GB.")
    command: str = Field(
        "python3 -m raytrain.train.pod_main", max_length=2000,
        description="What the pod runs for a job, over SSH: raytrain's pod runner, with "
        "raytrain installed (`pip install ... && python3 -m raytrain.train.pod_main`).")
    bid_per_gpu: float | None = Field(None, gt=0, description="The most an interruptible "
                                      "GPU-hour may cost; null: the going price.")


# What a capacity decision does: start on an option, stay where the job is, switch to
# another option, or wait (nothing holds the job now).
Action = Literal["start", "stay", "switch", "wait"]


class DecisionRecord(Record):
    time: float = Field(description="Unix time of the decision.")
    event: str = Field(description="What prompted it: submit, preemption, deadline, ...")
    action: Action = Field(description="start, stay, switch, wait.")
    offer: str | None = Field(None, description="The chosen offer's id.")
    market: str | None = Field(None, description="spot or on-demand, when it buys.")
    nodes: int = Field(0, description="Nodes it buys or holds.")
    usd_per_hour: float = Field(0.0, description="Hourly price of those nodes.")
    expected_hours: float | None = Field(None, description="Expected hours to finish there.")
    expected_cost_usd: float | None = Field(
        None, description="Expected dollars to finish there.")
    checkpoint_interval_s: float | None = Field(
        None, description="Checkpoint interval the policy chose (null: the job's own).")
    reason: str = Field(description="Why, in one line.")
