"""Which jobs train on when part of their capacity is lost, and how a step's samples are
shared among the replica groups that are alive.

A job's data-parallel replicas (`dp_replicate`) are replica groups: each a whole copy of the
model, laid out inside the group as the job says (FSDP, tensor, pipeline). They can outlive
each other (parallel.elastic): on bought capacity a group lost with its node leaves the others
training while a replacement is bought and heals from a live group; on a fixed cluster (the
operator's own machines) a group that loses a worker (a GPU's Xid error, a process killed)
leaves the others training while it is started again where Ray can place it. The math does not
change: the samples of step s are always [s * global_batch, (s + 1) * global_batch), and
the groups alive at a step share them, taking a lost group's share as more accumulation.

    run_groups(spec, layout, worker_resources)  # the groups a run of the job is made of
    elastic_groups(spec, layout, nodes=8)      # 8 for dp_replicate 8 on 8 nodes; 1: rigid
    share_of_step(units=16, alive=7, rank=2)   # the micro-batch units group 2 runs
"""

from __future__ import annotations

from collections.abc import Mapping

from raytrain.spec import JobSpec, Layout


def run_groups(spec: JobSpec, layout: Layout,
               worker_resources: Mapping[str, float] | None) -> int:
    """The replica groups a run of the job is made of: on bought nodes (`worker_resources`,
    each worker's share of its node type), elastic_groups of the nodes bought; on a fixed
    cluster, where no node is bought and none is lost to a cloud, each replica is a group of
    its own all the same, so that a worker lost there costs only its group."""
    if not worker_resources:
        return groups_of(spec, layout.dp_replicate, layout.dp_replicate, _interleaved(layout))
    return elastic_groups(spec, layout, bought_nodes(spec, worker_resources))


def elastic_groups(spec: JobSpec, layout: Layout, nodes: int) -> int:
    """Replica groups that can train on without each other: the layout's dp_replicate when
    the job allows it (parallel.elastic), it spans two or more nodes, and groups hold whole
    nodes (or nodes whole groups); 1 when the job is rigid."""
    return groups_of(spec, layout.dp_replicate, nodes, _interleaved(layout))


def _interleaved(layout: Layout) -> bool:
    return layout.pp_enabled and layout.schedule == "interleaved_1f1b"


def bought_nodes(spec: JobSpec, worker_resources: Mapping[str, float] | None) -> int:
    """The bought nodes a job's workers span: each worker asks for a share of its node
    type's resource (`worker_resources`); 0 on a fixed cluster (none asked for)."""
    if not worker_resources:
        return 0
    return round(sum(worker_resources.values()) * spec.resources.num_workers)


def groups_of(spec: JobSpec, dp_replicate: int, nodes: int, interleaved: bool = False
              ) -> int:
    """elastic_groups for a layout of `dp_replicate` replicas. A group may hold a whole
    pipeline: its share of a step's micro-batches changes as groups leave and join, and it
    runs a schedule for each count (raytrain.parallel.pipeline), save an interleaved one
    (`interleaved`), which torch builds only for some counts: such a job stays rigid."""
    groups = dp_replicate
    if not spec.parallel.elastic or groups < 2 or nodes < 2 or interleaved:
        return 1
    if groups % nodes and nodes % groups:
        return 1
    if spec.parallel.min_replica_groups >= groups:
        return 1
    return groups


def share_of_step(units: int, alive: int, rank: int) -> list[int]:
    """The micro-batch units (of a step's `units`, each a data-parallel rank's micro-batch
    times the group's inner data ranks) that the `rank`-th of `alive` groups runs: every
    alive-th from `rank`, so every unit is run once and the groups' shares differ by one at
    most."""
    if not 0 <= rank < alive:
        raise ValueError(f"group rank {rank} of {alive} alive")
    return list(range(rank, units, alive))
