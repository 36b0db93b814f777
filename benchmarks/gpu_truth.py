"""The planner's prediction against the step a GPU actually takes, and raytrain's loop against a
torchtitan-style loop on the same model: one table, one invocation.

    python -m benchmarks.gpu_truth [--ranks 1] [--steps 20] [--json]      # on a GPU machine
    python -m benchmarks.gpu_truth --device cpu --size tiny --steps 6     # a dry run

For the built-in GPT (about 1.4B parameters; `--size tiny` for a dry run) on `--ranks` GPUs of
this machine, each row is one torchrun, one after another so their ratios share the machine:

1. raytrain's loop (raytrain.train.loop.train), bf16 (autocast over fp32 weights, its
   default on GPUs), the layout a job of `--ranks` workers gets (data parallel on one GPU,
   FSDP2 over several), beside the figures a job's status shows for it: the planner's
   predicted step time and memory for that layout on the GPU kind found (`plan_summary`);
2. the same in fp32, whose prediction uses the fp32 peak; on a GPU kind with FP8 tensor cores,
   also in fp8 (torchao's float8 linears, raytrain.parallel.float8), predicted at the FP8 rate;
3. a torchtitan-style loop on the same model and batch (`reference_worker` below): FSDP2 on
   each block and the root with bf16 parameters and fp32 gradient reduction, fused AdamW,
   gradient clipping, no torch.compile, no autocast.

Measured: median step time over steady steps (the first two left out), tokens/s, and per rank
`torch.cuda.max_memory_allocated` (what the planner predicts, with its runtime reserve) and
`max_memory_reserved` (what torchtitan publishes). scripts/gpu_check.sh runs it on one GPU
and on all of them. It needs nothing from outside the machine: the model is built in place
and the data are random tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # torchrun runs this file as a script

SIZES = {
    "1b": {"vocab_size": 32000, "dim": 2048, "num_layers": 24, "num_heads": 16,
           "max_seq_len": 2048},
    "tiny": {"vocab_size": 512, "dim": 64, "num_layers": 2, "num_heads": 4, "max_seq_len": 64},
}
MICRO_BATCH = {"1b": 4, "tiny": 2}
# torch.cuda.get_device_name() fragments, most specific first, to the catalog's kinds
KINDS = (("H200", "h200"), ("H100 PCIe", "h100-pcie"), ("H100", "h100-sxm"),
         ("A100-SXM4-40GB", "a100-40gb-sxm"), ("A100", "a100-80gb-sxm"), ("4090", "rtx4090"),
         ("L40S", "l40s"), ("A10G", "a10g"), ("V100", "v100-16gb"), ("T4", "t4"))


def catalog_kind(device_name: str) -> str | None:
    from raytrain.catalog.hardware import GPUS

    for fragment, kind in KINDS:
        if fragment in device_name and kind in GPUS:
            return kind
    return None


def job_document(size: str, ranks: int, steps: int, device: str, kind: str | None,
                 precision: str) -> dict[str, Any]:
    from benchmarks.parallel_strategies import document

    strategy = "data" if ranks == 1 else "fsdp"
    doc = document({"strategy": strategy}, ranks, steps, MICRO_BATCH[size] * ranks,
                   MICRO_BATCH[size], device, SIZES[size])
    doc["training"]["precision"] = precision
    if kind and device == "cuda":
        doc["resources"]["accelerator"] = kind
    return doc


def reference_worker(spec_path: str, out: str, device_type: str) -> None:
    """Run under torchrun: the torchtitan-style loop on the job's model and batch."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from benchmarks.parallel_strategies import rss_bytes, write_record
    from raytrain.models.registry import build_model
    from raytrain.spec import JobSpec

    spec = JobSpec.model_validate(json.loads(Path(spec_path).read_text()))
    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    rss_before = rss_bytes()
    mesh = init_device_mesh(device_type, (world,))
    with torch.device("meta"):
        model = build_model(spec.model, seed=spec.training.seed)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    model.init_weights()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.training.learning_rate,
                                  fused=device_type == "cuda")
    micro, seq = spec.training.micro_batch_size, spec.data.seq_len
    vocab = spec.model.gpt.vocab_size
    generator = torch.Generator(device=device).manual_seed(rank)
    points = []
    for step in range(spec.training.steps - 1):  # as raytrain's worker: no final checkpoint
        tokens = torch.randint(0, vocab, (micro, seq + 1), device=device, generator=generator)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        if spec.training.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.training.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the step is done when its loss is known, as in raytrain's loop
        points.append((step + 1, time.perf_counter()))
    write_record(out, rank, points, device, rss_before)
    dist.destroy_process_group()


def measure(size: str, ranks: int, steps: int, device: str) -> dict[str, Any]:
    """Every row, with the planner's figures where it has the GPU kind."""
    import torch

    from benchmarks.parallel_strategies import HERE as RAYTRAIN_WORKER
    from benchmarks.parallel_strategies import run
    from raytrain.catalog.hardware import fp8_kinds
    from raytrain.core.resolve import plan_summary
    from raytrain.spec import parse_job_spec

    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    kind = catalog_kind(name) if device == "cuda" else "cpu"
    rows = []
    settings = [("raytrain loop, bf16", "bf16", RAYTRAIN_WORKER),
                ("raytrain loop, fp32", "fp32", RAYTRAIN_WORKER),
                ("torchtitan-style loop, bf16, FSDP2", "bf16", HERE)]
    if kind in fp8_kinds():  # float8 linears (torchao), beside the bf16 row they speed up
        settings.insert(1, ("raytrain loop, fp8", "fp8", RAYTRAIN_WORKER))
    for label, precision, script in settings:
        doc = job_document(size, ranks, steps, device, kind, precision)
        spec = parse_job_spec(doc)
        ours = script == RAYTRAIN_WORKER
        summary = plan_summary(spec) if (kind and ours) else None
        measured = run({}, ranks, steps, doc["training"]["global_batch_size"],
                       MICRO_BATCH[size], device, SIZES[size], spec=doc, script=script)
        rows.append({
            "setting": label,
            "layout": spec.stated_layout().describe() if ours else f"FSDP2 over {ranks}",
            "step_s": measured["step_s"], "tokens_per_s": measured["tokens_per_s"],
            "peak_gib": max(measured["peak_bytes"]) / 2**30,
            "reserved_gib": (max(measured["reserved_bytes"]) / 2**30
                             if measured["reserved_bytes"][0] is not None else None),
            "predicted_step_s": summary.predicted_step_s if summary else None,
            "predicted_memory_gib": summary.predicted_memory_gib if summary else None,
        })
    return {"device": name, "kind": kind, "ranks": ranks, "model": SIZES[size],
            "micro_batch": MICRO_BATCH[size], "rows": rows}


def table(result: dict[str, Any]) -> str:
    def cell(value: float | None, digits: str) -> str:
        return "-" if value is None else format(value, digits)

    lines = [f"{result['ranks']} x {result['device']} (catalog kind {result['kind']}); GPT "
             f"{result['model']}, micro-batch {result['micro_batch']} per rank",
             "| setting | layout | step s | predicted s | measured / predicted | tokens/s | "
             "peak GiB (GPU: allocated; CPU: RSS) | predicted GiB | peak reserved GiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        ratio = (row["step_s"] / row["predicted_step_s"]) if row["predicted_step_s"] else None
        lines.append(
            f"| {row['setting']} | {row['layout']} | {row['step_s']:.4f} | "
            f"{cell(row['predicted_step_s'], '.4f')} | {cell(ratio, '.2f')} | "
            f"{row['tokens_per_s']:,.0f} | {row['peak_gib']:.2f} | "
            f"{cell(row['predicted_memory_gib'], '.2f')} | {cell(row['reserved_gib'], '.2f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--size", default="1b", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        reference_worker(*args.worker)
        return
    result = measure(args.size, args.ranks, args.steps, args.device)
    print(json.dumps(result) if args.json else table(result), flush=True)


if __name__ == "__main__":
    main()
