"""An offer as the planner sees it: the shape of one of its nodes (its GPUs, their link, its
network), which offers that differ only in price share.

    shape = node_shape_of(offer)            # NodeShape for raytrain.core.planner.plan
"""

from __future__ import annotations

from raytrain.catalog.hardware import CATALOG, LINKS, Catalog, NodeShape, network_link
from raytrain.spec import Offer


def shape_key(offer: Offer) -> tuple[str, int, str, float, bool]:
    """What of an offer the planner sees; offers that differ only in price share it."""
    return (offer.gpu_kind, offer.gpus_per_node, offer.intra_link, offer.network_gbps,
            offer.rdma)


def node_shape_of(offer: Offer, hardware: Catalog = CATALOG) -> NodeShape:
    """The planner's view of one node of the offer: its GPUs (as `hardware` has them), their
    link, and its network."""
    return shape_from_key(shape_key(offer), hardware)


def shape_from_key(key: tuple[str, int, str, float, bool], hardware: Catalog = CATALOG
                   ) -> NodeShape:
    gpu_kind, gpus_per_node, intra_link, network_gbps, rdma = key
    return NodeShape(
        name=f"{gpus_per_node}x{gpu_kind}",
        gpu=hardware.gpus[gpu_kind],
        gpus_per_node=gpus_per_node,
        intra=LINKS[intra_link],
        inter=network_link(network_gbps, gpus_per_node, rdma),
    )
