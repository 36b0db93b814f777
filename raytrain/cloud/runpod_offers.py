"""RunPod's prices in the offer catalog (`raytrain offers --refresh`): on-demand from REST
API v2's GPU catalog, interruptible from GraphQL's lowest bid (v2 has none).

    catalog = refresh(load_offers(state_dir), RunPodAPI(api_key()), now=time.time())
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from raytrain.cloud.runpod import GPU_KINDS, RunPodAPI, RunPodError, positive
from raytrain.spec import Offer, OfferCatalog

logger = logging.getLogger(__name__)


def refresh(catalog: OfferCatalog, api: RunPodAPI, now: float) -> OfferCatalog:
    """The catalog with its RunPod offers' prices from RunPod: on-demand from v2's catalog
    (the Secure Cloud price per GPU, times the pod's GPUs), interruptible from GraphQL's
    lowest bid (v2 has none). What fails keeps the previous figures with a warning; other
    providers' rows are unchanged."""
    rows = [o for o in catalog.offers if o.provider == "runpod"]
    warnings: list[str] = []
    refreshed: dict[str, Offer] = {}
    by_kind = {kind: gpu_id for gpu_id, kind in GPU_KINDS.items()}
    for count in sorted({o.gpus_per_node for o in rows}):
        try:
            types = {g.get("id"): g for g in api.gpus(count)}
        except RunPodError as exc:
            warnings.append(f"RunPod prices for {count}-GPU pods kept from before: {exc}")
            continue
        try:
            spot: dict[str, float | None] | None = api.spot_prices(count)
        except RunPodError as exc:
            spot = None
            warnings.append(f"RunPod interruptible prices for {count}-GPU pods kept from "
                            f"before: {exc}")
        for offer in (o for o in rows if o.gpus_per_node == count):
            gpu_id = by_kind.get(offer.gpu_kind, "")
            gpu = types.get(gpu_id)
            if gpu is None:
                warnings.append(f"RunPod lists no {offer.gpu_kind} now; {offer.id} keeps its "
                                "previous prices")
                continue
            price = positive((gpu.get("price") or {}).get(offer.region))
            update: dict[str, Any] = {"note": f"refreshed from RunPod {_day(now)}; stock "
                                              f"{gpu.get('availability') or 'unknown'}"}
            if price is not None:
                update["on_demand_usd_per_hour"] = price * count
            if spot is not None and spot.get(gpu_id) is not None:
                update["spot_usd_per_hour"] = float(spot[gpu_id] or 0.0) * count
            refreshed[offer.id] = Offer.model_validate({**offer.model_dump(), **update})
    for warning in warnings:
        logger.warning("offer refresh: %s", warning)
    source = "aws+runpod" if catalog.source in ("aws", "aws+runpod") else "runpod"
    return OfferCatalog(version=catalog.version, source=source,  # type: ignore[arg-type]
                        fetched_at=now, warnings=[*catalog.warnings, *warnings],
                        offers=[refreshed.get(o.id, o) for o in catalog.offers])


def _day(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%d")
