"""Which bought nodes each job is billed for. A cloud bills a node from when it is up to when
it is gone; the service bills that time to the job whose request the node answers, from when
the node appears to when it goes or the job lets it go (its end, or a move to other capacity).
Nodes of one node type are alike to the autoscaler, so the attribution is the service's: the
nodes a job's worker group runs on are its own; besides, a job keeps the nodes it holds while
they are up (as many as it asked for), and nodes that appear go to the jobs still short of
their count, in the order they asked. (A job that moves to other capacity keeps paying for
the old nodes until its group has left them.)

    held = attribute({"j1": frozenset({"a"})}, {"j1": ("p3-spot", 2)},
                     {"p3-spot": frozenset({"a", "b"})})        # {"j1": {"a", "b"}}
"""

from __future__ import annotations

from typing import Mapping


def attribute(held: Mapping[str, frozenset[str]], wants: Mapping[str, tuple[str, int]],
              alive: Mapping[str, frozenset[str]],
              using: Mapping[str, frozenset[str]] | None = None) -> dict[str, frozenset[str]]:
    """Each job in `wants` (job -> (node type, node count), in the order they asked) with the
    nodes it holds now, given what it `held` before, the nodes `alive` of each type, and the
    alive nodes each job's worker group runs on (`using`)."""
    using = using or {}
    taken: set[str] = {n for nodes in using.values() for n in nodes}
    now: dict[str, frozenset[str]] = {}
    for job, (node_type, count) in wants.items():
        up = alive.get(node_type, frozenset())
        kept = sorted((held.get(job, frozenset()) & up) - taken)[:count]
        now[job] = frozenset(kept) | using.get(job, frozenset())
        taken.update(kept)
    for job, (node_type, count) in wants.items():
        short = count - len(now[job] & alive.get(node_type, frozenset()))
        if short > 0:
            free = sorted(alive.get(node_type, frozenset()) - taken)[:short]
            now[job] = now[job] | frozenset(free)
            taken.update(free)
    return now
