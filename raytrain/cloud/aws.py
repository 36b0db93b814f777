"""The only code that talks to AWS: refreshing the AWS rows of the offer catalog.

- GPU count and network from `ec2.describe_instance_types`;
- spot price per zone from `ec2.describe_spot_price_history` (the latest Linux price in each
  zone; the offer keeps the cheapest zone);
- on-demand price from the Pricing API (`pricing.get_products`, served from us-east-1 for
  every region).

Anything that fails (no credentials, no network, an API error) keeps that row's previous
figures and adds a warning that says what failed and how to fix it; the catalog is never
left half-written. Offers from other providers are carried over unchanged.

    clients = Clients.from_session(boto3.Session())
    catalog = refresh(load_offers(state_dir), clients, now=time.time())
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from raytrain.spec import Offer, OfferCatalog

logger = logging.getLogger(__name__)

PRICING_REGION = "us-east-1"
# Fail fast when AWS cannot be reached: the snapshot is a fine answer meanwhile.
CLIENT_CONFIG = Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 1})


@dataclass(frozen=True)
class Clients:
    ec2: Any
    pricing: Any

    @staticmethod
    def create(region: str, endpoint_url: str | None = None,
               pricing_endpoint_url: str | None = None) -> Clients:
        session = boto3.Session(region_name=region)
        return Clients(
            ec2=session.client("ec2", endpoint_url=endpoint_url, config=CLIENT_CONFIG),
            pricing=session.client("pricing", region_name=PRICING_REGION,
                                   endpoint_url=pricing_endpoint_url or endpoint_url,
                                   config=CLIENT_CONFIG),
        )


def refresh(catalog: OfferCatalog, clients: Clients, region: str, now: float) -> OfferCatalog:
    """The catalog with its AWS offers in `region` refreshed where AWS answers."""
    warnings: list[str] = []
    rows = [o for o in catalog.offers if o.provider == "aws" and o.region == region]
    facts = _instance_facts(clients.ec2, [o.instance_type for o in rows], warnings)
    refreshed = {}
    for offer in rows:
        update: dict[str, Any] = dict(facts.get(offer.instance_type, {}))
        update.update(_spot_price(clients.ec2, offer.instance_type, now, warnings))
        on_demand = _on_demand_price(clients.pricing, offer.instance_type, region, warnings)
        if on_demand is not None:
            update["on_demand_usd_per_hour"] = on_demand
        if update:
            update["note"] = f"refreshed from AWS {_day(now)}"
        refreshed[offer.id] = Offer.model_validate({**offer.model_dump(), **update})
    if not rows:
        warnings.append(f"the catalog has no AWS offers in {region}. To fix: choose a region "
                        "the catalog lists")
    for warning in warnings:
        logger.warning("offer refresh: %s", warning)
    return OfferCatalog(
        version=catalog.version, source="aws", fetched_at=now, warnings=warnings,
        offers=[refreshed.get(o.id, o) for o in catalog.offers],
    )


def _day(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%d")


def _failed(what: str, exc: Exception, warnings: list[str]) -> None:
    warnings.append(f"{what} failed ({type(exc).__name__}: {exc}); kept the previous figures. "
                    "To fix: check AWS credentials and network access, then `raytrain offers "
                    "--refresh`")


def _instance_facts(ec2: Any, instance_types: list[str], warnings: list[str]
                    ) -> dict[str, dict[str, Any]]:
    if not instance_types:
        return {}
    try:
        answer = ec2.describe_instance_types(InstanceTypes=instance_types)
    except (BotoCoreError, ClientError) as exc:
        _failed("describe_instance_types", exc, warnings)
        return {}
    facts = {}
    for item in answer.get("InstanceTypes", []):
        gpus = item.get("GpuInfo", {}).get("Gpus", [])
        network = item.get("NetworkInfo", {})
        fact: dict[str, Any] = {"rdma": bool(network.get("EfaSupported", False))}
        if gpus:
            fact["gpus_per_node"] = sum(g.get("Count", 0) for g in gpus)
        gbps = _gbps(network.get("NetworkPerformance", ""))
        if gbps:
            fact["network_gbps"] = gbps
        facts[item["InstanceType"]] = fact
    return facts


def _gbps(performance: str) -> float | None:
    """'3200 Gigabit', 'Up to 25 Gigabit', '100 Gigabit' -> Gbit/s."""
    words = performance.replace("Up to", "").split()
    try:
        return float(words[0]) if words and words[1].lower().startswith("gigabit") else None
    except (ValueError, IndexError):
        return None


def _spot_price(ec2: Any, instance_type: str, now: float, warnings: list[str]
                ) -> dict[str, Any]:
    try:
        answer = ec2.describe_spot_price_history(
            InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX"],
            StartTime=dt.datetime.fromtimestamp(now - 3600, dt.timezone.utc),
        )
    except (BotoCoreError, ClientError) as exc:
        _failed(f"spot prices of {instance_type}", exc, warnings)
        return {}
    latest: dict[str, tuple[Any, float]] = {}  # zone -> (time, price)
    for item in answer.get("SpotPriceHistory", []):
        zone, stamp, price = item["AvailabilityZone"], item["Timestamp"], float(item["SpotPrice"])
        if zone not in latest or stamp > latest[zone][0]:
            latest[zone] = (stamp, price)
    if not latest:
        return {}  # no spot market for this type here: keep what the catalog had
    zone, (_, price) = min(latest.items(), key=lambda kv: kv[1][1])
    return {"spot_usd_per_hour": price, "spot_zone": zone}


def _on_demand_price(pricing: Any, instance_type: str, region: str, warnings: list[str]
                     ) -> float | None:
    filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
        ("instanceType", instance_type), ("regionCode", region), ("operatingSystem", "Linux"),
        ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
    try:
        answer = pricing.get_products(ServiceCode="AmazonEC2", Filters=filters, MaxResults=10)
    except (BotoCoreError, ClientError) as exc:
        _failed(f"on-demand price of {instance_type}", exc, warnings)
        return None
    for text in answer.get("PriceList", []):
        product = json.loads(text) if isinstance(text, str) else text
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if usd is not None and dimension.get("unit", "Hrs") == "Hrs" and float(usd) > 0:
                    return float(usd)
    warnings.append(f"the Pricing API lists no on-demand Linux price for {instance_type} in "
                    f"{region}; kept the previous one")
    return None
