"""What a job makes of an offer: its throughput on a number of nodes (the planner's
prediction, the `Throughput` the policy in raytrain.core.autoscale ranks options by), whether
an offer has the job's devices, and what is left of the job (its `Goal`).

    throughput = job_throughput(spec)   # (tokens/s, layout, replica groups) for (offer, nodes)
    decision = choose(job_goal(spec), offers, throughput, policy)
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Callable, Iterable, TypeVar

from raytrain.catalog.hardware import CATALOG, Catalog, fp8_kinds
from raytrain.core.autoscale import Goal, Throughput
from raytrain.core.elastic import elastic_groups
from raytrain.core.planner import ModelDims, Workload, evaluate, fastest
from raytrain.core.resolve import planner_inputs
from raytrain.core.shapes import shape_from_key, shape_key
from raytrain.spec import JobSpec, Layout, Offer


def planner_throughput(dims: ModelDims, work: Workload, hardware: Catalog = CATALOG
                       ) -> Throughput:
    """The planner's best throughput for the job on `nodes` of an offer, memoised per node
    shape and count (offers that differ only in price share one search)."""
    best = _planner_layouts(dims, work, hardware)

    def throughput(offer: Offer, nodes: int) -> tuple[float, str] | None:
        fit = best(offer, nodes)
        return None if fit is None else (fit[0], fit[1])

    return throughput


# tokens/s, the layout described, and the layout; None: nothing fits.
Layouts = Callable[[Offer, int], "tuple[float, str, Layout | None] | None"]
Fit = TypeVar("Fit")  # what a throughput function gives for an option it can run


def _planner_layouts(dims: ModelDims, work: Workload, hardware: Catalog) -> Layouts:
    @lru_cache(maxsize=None)
    def best(key: tuple[str, int, str, float, bool], nodes: int
             ) -> tuple[float, str, Layout] | None:
        top = fastest(dims, work, nodes * key[1], shape_from_key(key, hardware))
        return None if top is None else (top.tokens_per_s, top.candidate.describe(),
                                         top.candidate)

    return lambda offer, nodes: best(shape_key(offer), nodes)


def flops_throughput(tokens_per_s_per_pflops: float, hardware: Catalog = CATALOG
                     ) -> Throughput:
    """For a model whose dimensions are unknown: throughput proportional to the offer's
    achievable dense FLOP/s, at a rate per PFLOP/s the caller states."""

    def throughput(offer: Offer, nodes: int) -> tuple[float, str] | None:
        gpu = hardware.gpus[offer.gpu_kind]
        pflops = gpu.bf16_flops * gpu.achievable * nodes * offer.gpus_per_node / 1e15
        return tokens_per_s_per_pflops * pflops, f"dp{nodes * offer.gpus_per_node} (assumed)"

    return throughput


def fixed_devices(throughput: Callable[[Offer, int], Fit | None], devices: int
                  ) -> Callable[[Offer, int], Fit | None]:
    """Only node counts that give exactly `devices` devices (a job whose layout is fixed)."""
    return lambda offer, nodes: (throughput(offer, nodes)
                                 if nodes * offer.gpus_per_node == devices else None)


def offer_matches(spec: JobSpec, offer: Offer) -> bool:
    """Whether an offer's nodes have the devices the job asks for: CPU nodes for a CPU job
    (gpus_per_worker 0), GPU nodes of the job's accelerator (any GPU kind if it names none)
    for a GPU job. Predictions are then for the devices the job would run on."""
    if not spec.resources.use_gpu:
        return offer.gpu_kind == "cpu"
    wanted = spec.resources.accelerator
    if spec.training.precision == "fp8" and offer.gpu_kind not in fp8_kinds():
        return False
    return offer.gpu_kind != "cpu" and (wanted is None or offer.gpu_kind == wanted)


def device_mismatch(spec: JobSpec, offers: Iterable[Offer]) -> str | None:
    """Why no offer can hold the job's devices, with the fix; None if some offer can."""
    offers = list(offers)
    if any(offer_matches(spec, o) for o in offers):
        return None
    kinds = sorted({o.gpu_kind for o in offers}) or ["none"]
    if not spec.resources.use_gpu:
        return ("no offer has CPU-only nodes, and the job asks for CPU workers "
                "(resources.gpus_per_worker 0). To fix: set resources.gpus_per_worker and "
                f"resources.accelerator (offers have: {', '.join(kinds)})")
    gpus = [k for k in kinds if k not in ("cpu", "none")]
    if not gpus:
        return ("no offer has GPU nodes, and the job asks for GPUs (resources.gpus_per_worker "
                f"{spec.resources.gpus_per_worker:g}). To fix: set resources.gpus_per_worker 0 "
                "to train on CPU nodes, or use a service that buys GPU nodes")
    if spec.training.precision == "fp8" and spec.resources.accelerator is None:
        return ("no offer has GPUs with FP8 tensor cores, which training.precision 'fp8' "
                f"needs (offers have: {', '.join(gpus)}). To fix: use precision 'bf16'")
    wanted = spec.resources.accelerator or "GPU"
    return (f"no offer has {wanted} nodes. To fix: set resources.accelerator to one of "
            f"{', '.join(gpus)}")


def job_throughput(spec: JobSpec, hardware: Catalog = CATALOG) -> Throughput:
    """The planner's throughput for a job on an offer whose devices match it
    (`offer_matches`), with the devices as `hardware` has them: its best layout for any device
    count under strategy 'auto', else the job's own layout on exactly its number of workers. A
    model of unknown size is assumed to run at 1e3 tokens/s per achievable PFLOP/s (each
    option's layout says 'assumed')."""
    inner = _planned_throughput(spec, hardware)

    def throughput(offer: Offer, nodes: int) -> tuple[float, str, int] | None:
        fit = inner(offer, nodes) if offer_matches(spec, offer) else None
        if fit is None:
            return None
        layout = fit[2]
        return fit[0], fit[1], elastic_groups(spec, layout, nodes) if layout else 1

    return throughput


def _planned_throughput(spec: JobSpec, hardware: Catalog) -> Layouts:
    if spec.model.planned_shape is None:
        assumed = fixed_devices(flops_throughput(1e3, hardware), spec.resources.num_workers)

        def no_layout(offer: Offer, nodes: int) -> tuple[float, str, Layout | None] | None:
            fit = assumed(offer, nodes)
            return None if fit is None else (float(fit[0]), str(fit[1]), None)

        return no_layout
    dims, work, _, _ = planner_inputs(spec)
    own = spec.stated_layout()
    if own is None:  # strategy 'auto': the best layout for each option's devices
        return _planner_layouts(dims, replace(work, micro_batch_options=(1, 2, 4, 8, 16)),
                                hardware)

    @lru_cache(maxsize=None)
    def on_shape(key: tuple[str, int, str, float, bool]) -> tuple[float, str, Layout] | None:
        predicted = evaluate(dims, work, own, shape_from_key(key, hardware))
        return (predicted.tokens_per_s, own.describe(), own) if predicted.fits else None

    return fixed_devices(lambda offer, nodes: on_shape(shape_key(offer)),
                         spec.resources.num_workers)


def job_goal(spec: JobSpec, steps_done: int = 0, elapsed_s: float = 0.0,
             spent_usd: float = 0.0) -> Goal:
    """What is left of a job after `steps_done` steps, `elapsed_s` since submission and
    `spent_usd` spent."""
    capacity = spec.capacity
    deadline = None if capacity.deadline_hours is None else \
        max(1.0, capacity.deadline_hours * 3600 - elapsed_s)
    budget = None if capacity.budget_usd is None else max(0.0, capacity.budget_usd - spent_usd)
    markets = ("spot", "on-demand") if capacity.market == "auto" else (capacity.market,)
    tokens = max(1, spec.training.steps - steps_done) * spec.tokens_per_step
    return Goal(tokens, deadline, budget, capacity.max_usd_per_hour, markets)


def limit_nodes(throughput: Throughput, limits: dict[tuple[str, str], int]) -> Throughput:
    """`throughput`, but None for more nodes than an (offer id, market)'s limit (offers here
    are priced in one market each)."""
    return lambda offer, nodes: (None if nodes > limits.get((offer.id, offer.markets()[0]),
                                                             10**9)
                                 else throughput(offer, nodes))
