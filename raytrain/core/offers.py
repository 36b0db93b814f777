"""The offers answer shared by `raytrain offers` and `GET/POST /v1/offers`: the catalog, and
for a job, the policy's ranking of offer x market x node count and its choice.

    response = offers_response(load_offers(state_dir), policy, spec)
"""

from __future__ import annotations

from raytrain.core.autoscale import (
    choose,
    device_mismatch,
    job_goal,
    job_throughput,
    options,
)
from raytrain.spec import JobSpec, OfferCatalog, OfferRow, OffersResponse, PolicySpec


def offers_response(catalog: OfferCatalog, policy: PolicySpec | None = None,
                    spec: JobSpec | None = None, keep: int = 20) -> OffersResponse:
    response = OffersResponse(catalog_version=catalog.version, source=catalog.source,
                              warnings=catalog.warnings, offers=catalog.offers)
    if spec is None or policy is None:
        return response
    goal, throughput = job_goal(spec), job_throughput(spec)
    ranked = options(goal, catalog.offers, throughput, policy)
    decision = choose(goal, catalog.offers, throughput, policy)
    rows = [OfferRow(
        rank=i, offer=o.offer.id, instance_type=o.offer.instance_type,
        gpu_kind=o.offer.gpu_kind, market=o.market, nodes=o.nodes,  # type: ignore[arg-type]
        gpus=o.nodes * o.offer.gpus_per_node, usd_per_hour=o.usd_per_hour,
        tokens_per_s=o.tokens_per_s, layout=o.layout, preemptions_per_hour=o.preemptions_per_hour,
        checkpoint_interval_s=o.checkpoint_interval_s, expected_hours=o.expected_hours,
        expected_cost_usd=o.expected_cost_usd,
    ) for i, o in enumerate(ranked[:keep], start=1)]
    reason = device_mismatch(spec, catalog.offers) or decision.reason
    return response.model_copy(update={"policy": policy.name, "ranking": rows,
                                       "decision": reason})
