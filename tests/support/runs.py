"""Small jobs trained in this process, for tests: a tiny GPT's spec and a run of the training
loop as one process (the reference every layout and replica group is compared with)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from raytrain.core.resolve import job_layout
from raytrain.spec import JobSpec
from raytrain.train.loop import train
from raytrain.train.rank import WorkerInfo
from tests.support.jobs import RecordingSink

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
