"""Published large-scale training runs (benchmarks/published_runs.yaml) as the planner's
values: each run's model, workload, layout and node shape, and the tokens/s per GPU and peak
memory its source reports. The planner's kernel constants are fitted to the runs marked
`fit` and checked on the rest (benchmarks/planner_published.py, tests/pure/test_planner.py).

    for run in published_runs():
        predicted = evaluate(run.dims, run.work, run.layout, run.shape)
        predicted.tokens_per_s / run.layout.world_size, run.tokens_per_s_per_gpu
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import yaml

from raytrain.catalog.hardware import GPUS, LINKS, NODE_SHAPES, NodeShape, network_link
from raytrain.core.dims import ModelDims, Workload
from raytrain.spec.layout import Layout

FILE = Path(__file__).with_suffix(".yaml")


@dataclass(frozen=True)
class PublishedRun:
    name: str
    role: str  # fit | validate
    source: str
    dims: ModelDims
    work: Workload
    layout: Layout
    shape: NodeShape
    tokens_per_s_per_gpu: float
    memory_gib: float | None
    fitted_gpu: bool  # the shape's matmul rate is fitted to its group's fit runs


def _shape(value: str | dict) -> NodeShape:
    if isinstance(value, str):
        return NODE_SHAPES[value]
    gpu = GPUS[value["gpu"]]
    if "memory_gb" in value:
        gpu = replace(gpu, memory_bytes=value["memory_gb"] * 1e9)
    if "gemm_efficiency" in value:
        gpu = replace(gpu, gemm_efficiency=value["gemm_efficiency"])
    per_node = value["gpus_per_node"]
    inter = LINKS[value["inter"]] if "inter" in value else \
        network_link(value["inter_gbits_per_node"], per_node, rdma=True)
    return NodeShape(f"{gpu.name}-{per_node}", gpu, per_node, LINKS[value["intra"]], inter)


def _run(group: dict, run: dict) -> PublishedRun:
    model = {**group.get("model", {}), **run.get("model", {})}
    layout = {**group.get("layout", {}), **run.get("layout", {})}
    work = {**group.get("workload", {}), **run.get("workload", {})}
    dims = ModelDims(model["layers"], model["dim"], model["heads"],
                     model.get("ffn", 4 * model["dim"]), model["vocab"], model["seq"],
                     num_kv_heads=model.get("kv_heads"), gated_mlp=model.get("gated", False),
                     position_rows=model.get("position_rows", 0))
    gpus, batch = run["gpus"], run["gbs"]
    tp, pp, shard = layout.get("tp", 1), layout.get("pp", 1), layout.get("dp_shard", 1)
    replicas = gpus // (tp * pp * shard)
    micro = layout.get("micro_batch_size", 1)
    v = layout.get("virtual_stages", 1)
    recompute = layout.get("recompute", "none")
    candidate = Layout(replicas, shard, tp, pp, v, micro, batch // (replicas * shard * micro),
                       recompute, schedule="interleaved_1f1b" if v > 1 else "1f1b",
                       sequence_parallel=layout.get("sequence_parallel", True))
    if "recompute_options" not in work:
        work["recompute_options"] = (recompute,)
    workload = Workload(global_batch=batch, **{key: tuple(value) if isinstance(value, list)
                                               else value for key, value in work.items()})
    shape = run.get("shape", group["shape"])
    return PublishedRun(run["name"], run["role"], group["source"], dims, workload, candidate,
                        _shape(shape), _throughput(run, dims, gpus), run.get("memory_gib"),
                        isinstance(shape, dict) and shape.get("fitted", False))


def _throughput(run: dict, dims: ModelDims, gpus: int) -> float:
    if "tokens_per_s_per_gpu" in run:
        return float(run["tokens_per_s_per_gpu"])
    if "step_s" in run:
        return run["gbs"] * dims.seq_len / run["step_s"] / gpus
    if run.get("tflops_formula") == "model":  # the planner's own count (cost_model)
        return run["tflops_per_gpu"] * 1e12 / dims.flops_per_token
    layers, h, s, vocab = dims.num_layers, dims.dim, dims.seq_len, dims.vocab_size
    per_token = 96 * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    return run["tflops_per_gpu"] * 1e12 / per_token


@cache
def published_runs() -> tuple[PublishedRun, ...]:
    document = yaml.safe_load(FILE.read_text())
    return tuple(_run(group, run) for group in document["groups"] for run in group["runs"])
