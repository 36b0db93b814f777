"""raytrain's step on a GPU, measured beside the planner's prediction and beside a
torchtitan-style loop on the same model: one table per model, one invocation.

    python -m benchmarks.gpu_truth [--ranks 1] [--steps 12] [--json FILE]       # on a GPU
    python -m benchmarks.gpu_truth --device cpu --models tiny --steps 6         # a dry run

Models (`--models`): the built-in GPT of about 1.4B parameters (`gpt-1.4b`, micro-batch 4)
and a Llama-style model of about 2.8B (`llama-3b`: grouped-query attention, SwiGLU,
rotary positions; micro-batch 2), both at sequence 2,048 with a 32,000 vocabulary; `tiny`
and `tiny-llama` for a dry run. Rows, each one torchrun, one after another so that their
ratios share the machine:

1. raytrain's loop (raytrain.train.loop.train), bf16, eager (`training.compile: false`);
2. the same compiled (each block under torch.compile, the GPU default);
3. fp8 compiled (torchao's float8 linears, tensorwise scaling), on GPU kinds with FP8
   tensor cores and on CPU (emulated, for the dry run);
4. a torchtitan-style loop on the same model and batch (`reference_worker` below): each
   block compiled, then FSDP2 on each block and the root with bf16 parameters and fp32
   gradient reduction (over one rank too, as this loop always runs it), the loss compiled,
   fused AdamW, gradient clipping, random tokens made on the device;
5. `--eager-reference`: the same loop uncompiled (the comparison of the first GPU run).

Per row: the median step over steady steps (the first two, and the profiled ones, left
out), the part of it spent waiting for data (raytrain's rows: the loop's own `data_s`),
tokens/s, MFU (tokens/s times the planner's FLOPs per token over the device's peak for the
row's precision, as a job's status computes it), the peak of allocated and reserved memory,
the time from the process's start to its first step done (building, compiling), and the
planner's predicted step time and memory for the row's job. The raytrain bf16 compiled
row's last two steps run under torch.profiler; its top kernels by device time are printed
after the table. A row that fails is shown with its error; the others still run.
scripts/gpu_check.sh runs it on one GPU and on all of them. It needs nothing from outside
the machine: the models are built in place and the data are synthetic tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # torchrun runs this file as a script

GPT_1B = {"vocab_size": 32000, "dim": 2048, "num_layers": 24, "num_heads": 16,
          "max_seq_len": 2048}
LLAMA_3B = {"vocab_size": 32000, "dim": 3072, "num_layers": 26, "num_heads": 24,
            "num_kv_heads": 8, "mlp": "swiglu", "ffn_dim": 8192, "positions": "rotary",
            "max_seq_len": 2048}
MODELS: dict[str, tuple[dict[str, Any], int]] = {  # name: (model.gpt, micro-batch per rank)
    "gpt-1.4b": (GPT_1B, 4),
    "llama-3b": (LLAMA_3B, 2),
    "tiny": ({"vocab_size": 512, "dim": 64, "num_layers": 2, "num_heads": 4,
              "max_seq_len": 64}, 2),
    "tiny-llama": ({"vocab_size": 512, "dim": 64, "num_layers": 2, "num_heads": 4,
                    "num_kv_heads": 2, "mlp": "swiglu", "ffn_dim": 128,
                    "positions": "rotary", "max_seq_len": 64}, 2),
}
PROFILED_STEPS = 2
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


def job_document(model: str, ranks: int, steps: int, device: str, kind: str | None,
                 precision: str, compiled: bool) -> dict[str, Any]:
    from benchmarks.parallel_strategies import document

    gpt, micro = MODELS[model]
    strategy = "data" if ranks == 1 else "fsdp"
    doc = document({"strategy": strategy}, ranks, steps, micro * ranks, micro, device, gpt)
    doc["training"].update(precision=precision, compile=compiled)
    if kind and device == "cuda":
        doc["resources"]["accelerator"] = kind
    return doc


# ------------------------------------------------------------------------------ worker side


class _Profiled:
    """torch.profiler over the steps from `first` on (None: no profile); `table()` is its
    top kernels by device time (CPU time on CPU)."""

    def __init__(self, first: int | None, device_type: str) -> None:
        import torch.profiler as tp

        self.first, self.profile = first, None
        self.sort = "self_cuda_time_total" if device_type == "cuda" else "self_cpu_time_total"
        if first is not None:
            activities = [tp.ProfilerActivity.CPU] + (
                [tp.ProfilerActivity.CUDA] if device_type == "cuda" else [])
            self.profile = tp.profile(activities=activities)

    def after_step(self, step: int) -> None:
        if self.profile is None or self.first is None:
            return
        if step + 1 == self.first:
            self.profile.__enter__()

    def table(self) -> str | None:
        if self.profile is None or self.profile.profiler is None:
            return None
        self.profile.__exit__(None, None, None)
        return str(self.profile.key_averages().table(sort_by=self.sort, row_limit=15))


def raytrain_worker(spec_path: str, out: str, device_type: str, profile_from: int | None
                    ) -> None:
    """Run under torchrun: raytrain's loop, with each step's time and data wait (rank 0
    profiles the steps from `profile_from` on)."""
    import raytrain.train.loop  # noqa: F401 - imported before the clock starts, as the reference's are
    from benchmarks.parallel_strategies import train_timed

    started = time.perf_counter()
    first = profile_from if int(os.environ.get("RANK", 0)) == 0 else None
    profiled = _Profiled(first, device_type)
    rank, points, device, rss_before = train_timed(
        spec_path, device_type, profiled.after_step, one_thread=device_type != "cuda")
    _finish(out, rank, points, device, rss_before, started, profiled)


def _finish(out: str, rank: int, points: list[tuple[int, float, float]], device: Any,
            rss_before: int, started: float, profiled: _Profiled) -> None:
    from benchmarks.parallel_strategies import write_record

    write_record(out, rank, points, device, rss_before)
    record = json.loads(Path(out, f"rank{rank}.json").read_text())
    record["first_step_s"] = points[0][1] - started if points else None
    record["profile"] = profiled.table()
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))


def reference_worker(spec_path: str, out: str, device_type: str) -> None:
    """Run under torchrun: the torchtitan-style loop on the job's model and batch
    (`training.compile` as the row says)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from benchmarks.parallel_strategies import device_of, rss_bytes
    from raytrain.models.registry import build_model
    from raytrain.spec import JobSpec

    started = time.perf_counter()
    spec = JobSpec.model_validate(json.loads(Path(spec_path).read_text()))
    rank = int(os.environ.get("RANK", 0))
    device = device_of(device_type, one_thread=device_type != "cuda")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    world = dist.get_world_size()
    rss_before = rss_bytes()
    mesh = init_device_mesh(device_type, (world,))
    with torch.device("meta"):
        model = build_model(spec.model, seed=spec.training.seed)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers.values():
        if spec.training.compile:
            block.compile()
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)
    model.init_weights()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.training.learning_rate,
                                  fused=device_type == "cuda")

    def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    loss_fn = torch.compile(loss_of) if spec.training.compile else loss_of
    micro, seq = spec.training.micro_batch_size, spec.data.seq_len
    vocab = spec.model.gpt.vocab_size
    generator = torch.Generator(device=device).manual_seed(rank)
    points: list[tuple[int, float, float]] = []
    for step in range(spec.training.steps - 1):  # as raytrain's worker: no final checkpoint
        tokens = torch.randint(0, vocab, (micro, seq + 1), device=device, generator=generator)
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        if spec.training.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.training.grad_clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()  # the step is done when its loss is known, as in raytrain's loop
        points.append((step + 1, time.perf_counter(), 0.0))
    _finish(out, rank, points, device, rss_before, started, _Profiled(None, device_type))
    dist.destroy_process_group()


# ------------------------------------------------------------------------------ driver side


def settings(kind: str | None, eager_reference: bool) -> list[tuple[str, str, bool, bool]]:
    """(label, precision, compiled, raytrain's loop) for each row, in the order run."""
    from raytrain.catalog.hardware import fp8_kinds

    rows = [("raytrain bf16 eager", "bf16", False, True),
            ("raytrain bf16 compiled", "bf16", True, True)]
    if kind == "cpu" or kind in fp8_kinds():
        rows.append(("raytrain fp8 compiled", "fp8", True, True))
    rows.append(("torchtitan-style bf16 compiled", "bf16", True, False))
    if eager_reference:
        rows.append(("torchtitan-style bf16 eager", "bf16", False, False))
    return rows


def measure(model: str, ranks: int, steps: int, device: str, eager_reference: bool = False,
            only: list[str] | None = None) -> dict[str, Any]:
    """Every row of one model, with the planner's figures where it knows the GPU kind."""
    import torch

    from benchmarks.parallel_strategies import run
    from raytrain.core.resolve import measured_mfu, plan_summary
    from raytrain.spec import parse_job_spec

    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    kind = catalog_kind(name) if device == "cuda" else "cpu"
    gpt, micro = MODELS[model]
    rows: list[dict[str, Any]] = []
    profile: str | None = None
    for label, precision, compiled, ours in settings(kind, eager_reference or bool(only)):
        if only and label not in only:
            continue
        doc = job_document(model, ranks, steps, device, kind, precision, compiled)
        spec = parse_job_spec(doc)
        summary = plan_summary(spec) if kind and kind != "cpu" else None
        profiled = ours and compiled and precision == "bf16"
        profile_from = steps - PROFILED_STEPS if profiled else None
        began = time.perf_counter()
        row: dict[str, Any] = {
            "setting": label,
            "layout": spec.stated_layout().describe() if ours else f"FSDP2 over {ranks}",
            "predicted_step_s": summary.predicted_step_s if summary else None,
            "predicted_memory_gib": summary.predicted_memory_gib if summary else None}
        try:
            measured = run({}, ranks, steps, doc["training"]["global_batch_size"], micro,
                           device, gpt, spec=doc, script=HERE, worker_args=(
                               "--mode", "raytrain" if ours else "reference",
                               "--profile-from", str(profile_from or 0)))
        except (RuntimeError, OSError, ValueError) as error:
            rows.append({**row, "error": str(error), "wall_s": time.perf_counter() - began})
            print(f"{model}: {label} failed: {error}", file=sys.stderr, flush=True)
            continue
        points = measured["points"]
        steady = points[2:len(points) - (PROFILED_STEPS if profiled else 0)]
        step_s = statistics.median(b[1] - a[1] for a, b in zip(steady, steady[1:]))
        tokens_per_s = doc["training"]["global_batch_size"] * gpt["max_seq_len"] / step_s
        record = measured["records"][0]
        profile = record.get("profile") or profile
        rows.append({
            **row, "step_s": step_s,
            "data_s": statistics.median(point[2] for point in steady),
            "tokens_per_s": tokens_per_s,
            "mfu": (measured_mfu(spec, tokens_per_s, ranks, kind)
                    if kind and kind != "cpu" else None),
            "peak_gib": max(measured["peak_bytes"]) / 2**30,
            "reserved_gib": (max(measured["reserved_bytes"]) / 2**30
                             if measured["reserved_bytes"][0] is not None else None),
            "first_step_s": record.get("first_step_s"),
            "wall_s": time.perf_counter() - began,
        })
        print(f"{model}: {label}: {step_s:.4f} s a step ({rows[-1]['wall_s']:.0f} s)",
              file=sys.stderr, flush=True)
    return {"model": model, "gpt": gpt, "micro_batch": micro, "ranks": ranks,
            "device": name, "kind": kind, "rows": rows, "profile": profile}


def machine() -> dict[str, Any]:
    """What the figures were taken on: torch and torchao versions, the GPU and its clocks."""
    import torch

    facts: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    try:
        import torchao

        facts["torchao"] = torchao.__version__
    except ImportError:
        facts["torchao"] = None
    if torch.cuda.is_available():
        query = ("name,memory.total,driver_version,clocks.sm,clocks.max.sm,clocks.mem,"
                 "power.limit,temperature.gpu")
        try:
            facts["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", f"--query-gpu={query}", "--format=csv"], capture_output=True,
                text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as error:
            facts["nvidia_smi"] = f"unavailable: {error}"
    return facts


def _cell(value: float | None, digits: str) -> str:
    return "-" if value is None else format(value, digits)


def table(result: dict[str, Any]) -> str:
    """One model's rows as a Markdown table, ratios against raytrain's bf16 compiled row."""
    rows = result["rows"]
    base = next((r.get("step_s") for r in rows if r["setting"] == "raytrain bf16 compiled"),
                None)
    lines = [f"{result['ranks']} x {result['device']} (catalog kind {result['kind']}); "
             f"{result['model']} {result['gpt']}, micro-batch {result['micro_batch']} per rank",
             "| setting | layout | step s | of it data s | speed vs raytrain bf16 compiled | "
             "tokens/s | MFU | predicted s | measured / predicted | peak GiB (GPU: allocated;"
             " CPU: RSS) | reserved GiB | predicted GiB | to first step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            first = row["error"].splitlines()[0][:120]
            lines.append(f"| {row['setting']} | {row['layout']} | failed: {first} |"
                         + " |" * 10)
            continue
        speed = base / row["step_s"] if base else None
        ratio = row["step_s"] / row["predicted_step_s"] if row["predicted_step_s"] else None
        lines.append(
            f"| {row['setting']} | {row['layout']} | {row['step_s']:.4f} | "
            f"{row['data_s']:.4f} | {_cell(speed, '.3f')} | {row['tokens_per_s']:,.0f} | "
            f"{_cell(row['mfu'], '.1%')} | {_cell(row['predicted_step_s'], '.4f')} | "
            f"{_cell(ratio, '.2f')} | {row['peak_gib']:.2f} | {_cell(row['reserved_gib'], '.2f')}"
            f" | {_cell(row['predicted_memory_gib'], '.2f')} | "
            f"{_cell(row['first_step_s'], '.1f')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--models", nargs="+", default=["gpt-1.4b", "llama-3b"],
                        choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=12,
                        help="steps per row (the first two and the profiled ones not timed)")
    parser.add_argument("--eager-reference", action="store_true",
                        help="also the torchtitan-style loop uncompiled")
    parser.add_argument("--rows", nargs="+", metavar="SETTING",
                        help="only these rows (their settings as the table names them)")
    parser.add_argument("--json", help="write every figure to this file too")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=["raytrain", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--profile-from", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        if args.mode == "reference":
            reference_worker(*args.worker)
        else:
            raytrain_worker(*args.worker, profile_from=args.profile_from or None)
        return
    if args.steps < 5 + PROFILED_STEPS:
        parser.error(f"--steps must be at least {5 + PROFILED_STEPS}")
    facts = machine()
    print(json.dumps(facts), flush=True)
    results = []
    for model in args.models:
        result = measure(model, args.ranks, args.steps, args.device, args.eager_reference,
                         args.rows)
        results.append(result)
        print(table(result), flush=True)
        if result["profile"]:
            print(f"top kernels, raytrain bf16 compiled, {model}:\n{result['profile']}",
                  flush=True)
        if args.json:  # after each model: a run cut short keeps what it measured
            Path(args.json).write_text(json.dumps({"machine": facts, "results": results}))


if __name__ == "__main__":
    main()
