"""How many layers' activations a pipeline rank holds at once, in layer-micro-batches.

A rank's activation memory is the sum, over the micro-batches whose forward it has run and
whose backward it has not, of the layers of the stage each went through. For one stage per
rank that is a product (1F1B's rank r warms up with pp - r forwards; GPipe runs every
forward first). With several stages per rank the stages differ (the first holds only the
embeddings when it is one layer short, as Llama 3 splits its pipeline), so the count walks
the schedule torch.distributed.pipelining runs (ScheduleInterleaved1F1B, torch 2.13:
`_get_warmup_ops`, `forward_stage_index`, `backward_stage_index`; each steady-state step a
forward then a backward). Written here because torch builds its schedule only from live
pipeline stages; this is the same order from plain values.
"""

from __future__ import annotations

from functools import lru_cache

from raytrain.spec.layout import Layout, stage_layers, stages_of_rank


@lru_cache(maxsize=8192)
def rank_stage_layers(num_layers: int, pp: int, v: int, rank: int) -> tuple[int, ...]:
    """Layers of each of rank `rank`'s stages, in its local order."""
    layers = stage_layers(num_layers, pp * v)
    return tuple(len(layers[stage]) for stage in stages_of_rank(rank, pp, pp * v))


@lru_cache(maxsize=8192)
def interleaved_peak(pp: int, m: int, rank: int, layers: tuple[int, ...]) -> int:
    """The most layer-micro-batches rank `rank` holds under interleaved 1F1B with `m`
    micro-batches, its local stages holding `layers` layers each."""
    v = len(layers)
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
    held = peak = 0
    for step in range(m * v):
        held += layers[(step // per_round) % v]
        peak = max(peak, held)
        if step >= warmup:
            held -= layers[v - 1 - ((step - warmup) // per_round) % v]
    return peak


def layers_in_flight(num_layers: int, c: Layout, rank: int) -> int:
    """The most layer-micro-batches of activations pipeline rank `rank` holds at once."""
    layers = rank_stage_layers(num_layers, c.pp, c.virtual_stages, rank)
    if c.pp == 1:
        return sum(layers)
    if c.gpipe:
        return c.microbatches * sum(layers)
    if c.virtual_stages > 1:
        return interleaved_peak(c.pp, c.microbatches, rank, layers)
    return min(c.microbatches, c.pp - rank) * sum(layers)
