"""Prices and rates as the catalog states them: spot interruption rates from the bands
providers publish, and the one conversion of an hourly price into dollars. (An offer's node
shape, which needs the validated Offer, is raytrain.core.shapes.)

    band_rate(">20%")                       # interruptions per node-hour
    usd_for(98.32, seconds=1800, units=2)   # two nodes for half an hour: $98.32
"""

from __future__ import annotations

import math

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
