"""Small jobs trained in this process, for tests: a tiny GPT's spec and a run of the training
loop as one process (the reference every layout and replica group is compared with)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from raytrain.core.resolve import job_layout
from raytrain.spec import JobSpec
from raytrain.testing.jobs import RecordingSink
from raytrain.train.loop import train
from raytrain.train.rank import WorkerInfo

SMALL = {
    "model": {"gpt": {"vocab_size": 64, "dim": 32, "num_layers": 2, "num_heads": 4,
                      "max_seq_len": 16}},
    "data": {"seq_len": 16},
    "training": {"steps": 20, "global_batch_size": 8, "micro_batch_size": 2,
                 "checkpoint_every_steps": 10, "learning_rate": 0.01},
}


def small_spec(num_workers: int, **training: Any) -> JobSpec:
    document = json.loads(json.dumps(SMALL))
    document["training"].update(training)
    document["resources"] = {"num_workers": num_workers}
    return JobSpec.model_validate(document)


def run_single(spec: JobSpec, root: Path, **kwargs: Any) -> RecordingSink:
    sink = RecordingSink()
    train(spec, WorkerInfo.single_process(), sink, root, layout=job_layout(spec),
          progress_interval_s=0.0, **kwargs)
    return sink


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cold_start_reads(rank: int, world_size: int, port: int, job: dict[str, Any], root: str,
                     out: str) -> None:
    """One of `world_size` gloo ranks (mp.spawn): train the job to its first checkpoint in
    `root` (a bucket), then load that checkpoint into a fresh model as a cold start does, and
    write the bytes this rank fetched to OUT/read-RANK.json."""
    import os

    import torch
    import torch.distributed as dist

    from raytrain.train.checkpoint import CheckpointManager
    from raytrain.train.progress import NullSink
    from raytrain.train.rank import build_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        spec = JobSpec.model_validate(job)
        layout, worker = job_layout(spec), WorkerInfo.from_process_group(torch.device("cpu"))
        train(spec, worker, NullSink(), root, layout=layout, progress_interval_s=0.0)
        model, optimizers, _, _ = build_rank(spec, layout, worker)
        checkpoints = CheckpointManager(root, rank, world_size=world_size)
        latest = checkpoints.latest()
        assert latest is not None
        checkpoints.load(latest, model.parts, optimizers)
        (Path(out) / f"read-{rank}.json").write_text(json.dumps(
            {"bytes": checkpoints.bytes_read, "checkpoint": str(latest)}))
        dist.barrier()
    finally:
        dist.destroy_process_group()
