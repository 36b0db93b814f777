"""The offers answer shared by `raytrain offers` and `GET/POST /v1/offers`: the catalog, and
for a job, the policy's ranking of offer x market x node count and its choice.

    response = offers_response(load_offers(state_dir), policy, spec)
"""

from __future__ import annotations

from raytrain.catalog.hardware import CATALOG, Catalog
from raytrain.core.autoscale import Observed, choose, options
from raytrain.core.throughput import device_mismatch, job_goal, job_throughput
from raytrain.spec import (
    JobSpec,
    ObservedRate,
    OfferCatalog,
    OfferRow,
    OffersResponse,
    PolicySpec,
)


def offers_response(catalog: OfferCatalog, policy: PolicySpec | None = None,
                    spec: JobSpec | None = None, keep: int = 20,
                    observed: Observed = Observed(), hardware: Catalog = CATALOG
                    ) -> OffersResponse:
    """The catalog; with a policy, each spot offer's interruption rate as it ranks with it
    (the catalog's prior updated by `observed`); with a spec too, its ranking and choice,
    its throughput planned on `hardware`."""
    response = OffersResponse(catalog_version=catalog.version, source=catalog.source,
                              warnings=catalog.warnings, offers=catalog.offers)
    if policy is None:
        return response
    rates = [ObservedRate(
        offer=o.id, prior_per_node_hour=o.spot_interruptions_per_hour,
        preemptions=observed.spot_history.get(o.id, (0, 0.0))[0],
        spot_node_hours=observed.spot_history.get(o.id, (0, 0.0))[1],
        estimate_per_node_hour=observed.rate(o, policy.prior_node_hours),
    ) for o in catalog.offers if o.spot_usd_per_hour is not None]
    response = response.model_copy(update={"observed": rates})
    if spec is None:
        return response
    goal, throughput = job_goal(spec), job_throughput(spec, hardware)
    ranked = options(goal, catalog.offers, throughput, policy, observed)
    decision = choose(goal, catalog.offers, throughput, policy, observed)
    rows = [OfferRow(
        rank=i, offer=o.offer.id, instance_type=o.offer.instance_type,
        gpu_kind=o.offer.gpu_kind, market=o.market, nodes=o.nodes,
        gpus=o.nodes * o.offer.gpus_per_node, usd_per_hour=o.usd_per_hour,
        tokens_per_s=o.tokens_per_s, layout=o.layout, preemptions_per_hour=o.preemptions_per_hour,
        checkpoint_interval_s=o.checkpoint_interval_s, expected_hours=o.expected_hours,
        expected_cost_usd=o.expected_cost_usd,
    ) for i, o in enumerate(ranked[:keep], start=1)]
    reason = device_mismatch(spec, catalog.offers) or decision.reason
    return response.model_copy(update={"policy": policy.name, "ranking": rows,
                                       "decision": reason})
