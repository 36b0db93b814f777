"""Every parallel layout on gloo ranks (torch.multiprocessing), for the parity tests and
benchmarks/parity_cases.py: the cases, the jobs they train, and one process per rank that
trains each case and writes its losses and the bytes its collectives moved."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raytrain.core.resolve import job_layout
from raytrain.spec import JobSpec
from raytrain.testing.jobs import RecordingSink
from raytrain.train.loop import train
from raytrain.train.rank import WorkerInfo

STEPS = 8  # enough to compare a curve; the cut cases stop at 6 and resume for the rest


DEVICE = os.environ.get("RAYTRAIN_TEST_DEVICE", "cpu")


MODEL = {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 4, "num_heads": 4,
                 "max_seq_len": 16}}


LLAMA = {"gpt": {**MODEL["gpt"], "num_kv_heads": 2, "mlp": "swiglu", "ffn_dim": 48,
                 "positions": "rotary", "tie_embeddings": True}}


LLAMA_UNTIED = {"gpt": {**LLAMA["gpt"], "tie_embeddings": False}}


def job(num_workers: int, parallel: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None, **training: Any) -> dict:
    # Tensor-parallel ranks share their micro-batches: fewer of them (two per step on tp2,
    # one a replica on dp2 x tp2) halve the DTensor redistributions, about 1 ms each on CPU;
    # accumulation under tp is the two-rank cases'.
    tensor = (parallel or {}).get("strategy") == "tensor" or (parallel or {}).get("tp", 1) > 1
    micro = 4 if tensor else 2
    return {
        "model": model or MODEL,
        "data": {"seq_len": 16},
        "training": {"steps": STEPS, "global_batch_size": 8, "micro_batch_size": micro,
                     "checkpoint_every_steps": STEPS, "learning_rate": 0.01, **training},
        "parallel": parallel or {},
        "resources": {"num_workers": num_workers},
    }


def user_job(num_workers: int, strategy: str) -> dict:
    """A model and dataset of the user's own, by import path: data parallel layouts only."""
    document = job(num_workers, {"strategy": strategy})
    document["model"] = {"kind": "import", "factory": "raytrain.testing.jobs:make_tiny_model"}
    document["data"] = {"kind": "import", "seq_len": 16,
                        "factory": "raytrain.testing.jobs:make_dataset", "options": {"seq_len": 16}}
    return document


TWO_RANKS = {
    "dp2": {"strategy": "data"},
    "fsdp2": {"strategy": "fsdp"},
    "tp2_sequence_parallel": {"strategy": "tensor"},
    "tp2_no_sequence_parallel": {"strategy": "tensor", "sequence_parallel": False},
    "pp2_gpipe": {"strategy": "pipeline", "pipeline_schedule": "gpipe"},
    "pp2_1f1b": {"strategy": "pipeline", "pipeline_schedule": "1f1b"},
    "pp2_interleaved_1f1b_v2": {"strategy": "pipeline", "pipeline_schedule": "interleaved_1f1b",
                                "virtual_stages": 2},
    # 6 stages for 4 layers: the first holds only the embeddings, the last only the head
    "pp2_interleaved_1f1b_v3_bare_ends": {"strategy": "pipeline",
                                          "pipeline_schedule": "interleaved_1f1b",
                                          "virtual_stages": 3},
    "fsdp2_recompute": {"strategy": "fsdp", "activation_checkpointing": True},
    # 2 micro-batches per step (as fsdp2), reduce-scattered once, on the last
    "fsdp2_reduce_scatter_once": {"strategy": "fsdp", "reduce_scatter_once": True},
    # ZeRO-2: parameters kept gathered from each block's forward to its backward
    "fsdp2_zero2": {"strategy": "fsdp", "zero2": True},
}


LLAMA_TWO_RANKS = {
    "llama_dp2": (LLAMA, {"strategy": "data"}),
    "llama_fsdp2": (LLAMA, {"strategy": "fsdp"}),
    "llama_fsdp2_selective": (LLAMA, {"strategy": "fsdp", "recompute": "selective"}),
    "llama_tp2_sequence_parallel": (LLAMA, {"strategy": "tensor"}),
    "llama_untied_pp2_1f1b": (LLAMA_UNTIED, {"strategy": "pipeline"}),
}


FOUR_RANKS = {
    "dp2_tp2": {"strategy": "hybrid", "dp_replicate": 2, "tp": 2},
    "pp2_tp2": {"strategy": "hybrid", "pp": 2, "tp": 2},
    "hsdp_dp2_fsdp2": {"strategy": "hybrid", "dp_replicate": 2, "dp_shard": 2},
    "pp2_dp2": {"strategy": "pipeline", "dp_replicate": 2},
    "pp2_fsdp2": {"strategy": "pipeline", "dp_shard": 2},
}


def _device(rank: int) -> torch.device:
    return torch.device("cuda", rank) if DEVICE == "cuda" else torch.device("cpu")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_cases(rank: int, world_size: int, port: int, cases: list[tuple[str, dict, dict]],
               out_dir: str) -> None:
    """Run each (name, job document, train kwargs) on this rank; rank 0 writes the losses.
    A case may name a checkpoint to start from ('resume_from'), copied in by rank 0."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if DEVICE == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo", rank=rank,
                            world_size=world_size)
    counts = dict.fromkeys((file for *_, file in COUNTED), 0)
    originals = _count_bytes(counts)
    try:
        for name, document, kwargs in cases:
            root = Path(out_dir) / name
            kwargs = dict(kwargs)
            resume_from = kwargs.pop("resume_from", None)
            if rank == 0 and resume_from:
                shutil.copytree(resume_from, root / Path(resume_from).name)
            dist.barrier()
            sink = RecordingSink()
            counts.update(dict.fromkeys(counts, 0))
            spec = JobSpec.model_validate(document)
            train(spec, WorkerInfo.from_process_group(_device(rank)), sink, root,
                  layout=job_layout(spec), progress_interval_s=0.0, **kwargs)
            if rank == 0:
                (root / "losses.json").write_text(json.dumps(sink.losses()))
                (root / "val.json").write_text(json.dumps(
                    {r["val_step"]: r["val_loss"] for r in sink.reports if "val_loss" in r}))
                for file, count in counts.items():
                    (root / file).write_text(str(count))
            dist.barrier()
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
        dist.destroy_process_group()


COUNTED = (
    ("all_reduce", "tensor", 0, "all_reduced_bytes"),  # across data-parallel replicas, mostly
    ("reduce_scatter_single", "input", 1, "reduce_scattered_bytes"),  # FSDP2's gradients
    ("all_gather_single", "output_tensor", 0, "all_gathered_bytes"),  # FSDP2's parameters
)


def _count_bytes(counts: dict[str, int]) -> dict[str, Any]:
    """Make each COUNTED collective add its tensor's bytes to `counts`; the originals, to
    put back."""
    originals = {}
    for name, keyword, position, file in COUNTED:
        original = originals[name] = getattr(dist, name)

        def counted(*args: Any, _call: Any = original, _keyword: str = keyword,
                    _position: int = position, _file: str = file, **kwargs: Any) -> Any:
            tensor = kwargs[_keyword] if _keyword in kwargs else args[_position]
            counts[_file] += tensor.numel() * tensor.element_size()
            return _call(*args, **kwargs)

        setattr(dist, name, counted)
    return originals


def _spawn(world_size: int, cases: list[tuple[str, dict, dict]], out_dir: Path) -> None:
    mp.spawn(_run_cases, args=(world_size, _free_port(), cases, str(out_dir)), nprocs=world_size)


def _losses(path: Path) -> dict[int, float]:
    return {int(k): v for k, v in json.loads(path.read_text()).items()}


def held_expert_bytes(rank: int, world_size: int, port: int, document: dict[str, Any],
                      out: str) -> None:
    """One of `world_size` gloo ranks (mp.spawn): build the job's model under its layout and
    write the bytes of the experts' weights this rank holds to OUT/experts-RANK.txt, after
    a training step's forward and backward (nothing gathered stays), and the bytes its
    forward's all-to-alls sent to other ranks to OUT/all-to-all-RANK.txt."""
    from raytrain.models.moe import Experts
    from raytrain.parallel.parallelize import build_parallel_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        spec = JobSpec.model_validate(document)
        model = build_parallel_model(spec, job_layout(spec), torch.device("cpu"))
        tokens = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(rank))
        model.forward_backward([tokens])
        held = sum((p.to_local() if hasattr(p, "to_local") else p).nbytes
                   for part in model.parts for m in part.modules() if isinstance(m, Experts)
                   for p in m.parameters())
        (Path(out) / f"experts-{rank}.txt").write_text(str(held))
        sent = sum(m.dispatch.sent_bytes for part in model.parts for m in part.modules()
                   if getattr(m, "dispatch", None) is not None)
        (Path(out) / f"all-to-all-{rank}.txt").write_text(str(sent))
    finally:
        dist.destroy_process_group()
