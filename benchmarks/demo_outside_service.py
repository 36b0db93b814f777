"""The demo's step outside the service: its model and batch on 2 ranks under torchrun (no Ray),
as plain DDP and as raytrain's loop on the demo's own spec, alternating. Beside the step the
service measures for the same job (benchmarks/calibrated_examples.py), this separates what the
loop costs from what running inside Ray Train and beside the service costs.

    python -m benchmarks.demo_outside_service [--rounds 2] [--steps 400]

Plain DDP: two micro-batches of 4 x 64 tokens per rank, the first under no_sync, fused AdamW,
one thread per rank (benchmarks/loop_overhead.py compares the loop with plain DDP on a larger
workload).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))  # torchrun runs this file as a script
SKIP = 20  # steps of warm-up left out


def plain_ddp(steps: int) -> list[float]:
    """Run under torchrun: seconds per step of plain DDP on the demo's model and batch."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from raytrain import load_job_spec
    from raytrain.models.gpt import GPT

    spec = load_job_spec(ROOT / "examples/demo.yaml")
    gpt, seq = spec.model.gpt, spec.data.seq_len
    model = GPT(gpt)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    generator = torch.Generator().manual_seed(torch.distributed.get_rank())
    micro = spec.training.micro_batch_size

    def loss() -> torch.Tensor:
        tokens = torch.randint(0, gpt.vocab_size, (micro, seq + 1), generator=generator)
        logits = ddp(tokens[:, :-1]).flatten(0, 1).float()
        return F.cross_entropy(logits, tokens[:, 1:].flatten()) / 2

    times = []
    for _ in range(steps):
        started = time.perf_counter()
        with ddp.no_sync():
            loss().backward()
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return times[SKIP:]


def raytrain_loop(steps: int) -> list[float]:
    """Run under torchrun: seconds per step of raytrain's loop on the demo's spec, from its
    progress reports (checkpoints only at the end)."""
    import torch

    from raytrain import load_job_spec
    from raytrain.core.resolve import job_layout
    from raytrain.train.loop import train
    from raytrain.train.progress import NullSink
    from raytrain.train.rank import WorkerInfo

    class Points(NullSink):
        def __init__(self) -> None:
            self.points: list[tuple[int, float]] = []

        def progress(self, payload: dict[str, Any]) -> None:
            self.points.append((payload["step"], time.time()))

    spec = load_job_spec(ROOT / "examples/demo.yaml")
    training = spec.training.model_copy(update={"steps": steps, "checkpoint_every_steps": steps})
    spec = spec.model_copy(update={"training": training})
    sink = Points()
    with tempfile.TemporaryDirectory() as checkpoints:
        train(spec, WorkerInfo.from_process_group(torch.device("cpu")), sink, Path(checkpoints),
              layout=job_layout(spec))
    points = [p for p in sink.points if p[0] > SKIP]
    return [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(points, points[1:]) if b[0] > a[0]]


def worker(kind: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    times = (plain_ddp if kind == "plain" else raytrain_loop)(steps)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def run(kind: str, steps: int) -> float:
    """The median step of one torchrun of `kind` (plain | loop), in seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_port", "29534", str(HERE), "--worker", kind, str(steps), str(out)],
            check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return statistics.median(json.loads(out.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--worker", nargs=3, metavar=("KIND", "STEPS", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.worker[2])
        return
    for number in range(1, args.rounds + 1):
        plain, loop = run("plain", args.steps), run("loop", args.steps)
        print(f"round {number}: plain DDP {plain * 1e3:.1f} ms per step, raytrain's loop "
              f"{loop * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
