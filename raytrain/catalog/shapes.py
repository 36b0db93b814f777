"""Instance offers as the planner sees them: an offer's node shape, and spot interruption
rates from the bands providers publish.

The offers themselves are data (`raytrain/catalog/offers.yaml`, refreshed from AWS by
raytrain.cloud.aws) validated by `raytrain.spec.Offer`; this module only turns them into the
values the planner and the policy compute with.

    shape = node_shape_of(offer)            # NodeShape for raytrain.core.planner.plan
    band_rate(">20%")                       # interruptions per node-hour
    usd_for(98.32, seconds=1800, units=2)   # two nodes for half an hour: $98.32
"""

from __future__ import annotations

import math

from raytrain.catalog.hardware import GPUS, LINKS, NodeShape, network_link
from raytrain.spec import Offer

HOURS_PER_MONTH = 730.0

# AWS Spot Advisor publishes the share of instances interrupted in a month in bands; the
# policy takes the middle of a band (25% for the open-ended top band).
SPOT_ADVISOR_BANDS = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175,
                      ">20%": 0.25}


def band_rate(band: str) -> float:
    """Interruptions per node-hour for a Spot Advisor band: a share p of instances interrupted
    within a month is a rate of -ln(1 - p) / 730 per hour."""
    if band not in SPOT_ADVISOR_BANDS:
        raise ValueError(f"unknown interruption band {band!r}; known: "
                         + ", ".join(SPOT_ADVISOR_BANDS))
    return -math.log1p(-SPOT_ADVISOR_BANDS[band]) / HOURS_PER_MONTH


def usd_for(usd_per_hour: float, seconds: float, units: float = 1.0) -> float:
    """The price of `units` of capacity (nodes, devices) held for `seconds`: the one place
    raytrain turns an hourly price into dollars, for bills, plans and simulations alike."""
    return usd_per_hour * units * max(0.0, seconds) / 3600


def shape_key(offer: Offer) -> tuple[str, int, str, float, bool]:
    """What of an offer the planner sees; offers that differ only in price share it."""
    return (offer.gpu_kind, offer.gpus_per_node, offer.intra_link, offer.network_gbps,
            offer.rdma)


def node_shape_of(offer: Offer) -> NodeShape:
    """The planner's view of one node of the offer: its GPUs, their link, and its network."""
    return shape_from_key(shape_key(offer))


def shape_from_key(key: tuple[str, int, str, float, bool]) -> NodeShape:
    gpu_kind, gpus_per_node, intra_link, network_gbps, rdma = key
    return NodeShape(
        name=f"{gpus_per_node}x{gpu_kind}",
        gpu=GPUS[gpu_kind],
        gpus_per_node=gpus_per_node,
        intra=LINKS[intra_link],
        inter=network_link(network_gbps, gpus_per_node, rdma),
    )
