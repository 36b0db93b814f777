"""raytrain's training loop against the plain DDP reference, both under torchrun, no Ray.

Separates the loop's own cost from the cost of running inside Ray Train and the service
(benchmarks/dp_throughput.py measures the two together). Alternating rounds of
benchmarks/torchrun_ddp.py and of raytrain.train.loop.train with progress published once a
second to a sink that keeps the step timestamps; same model, data, batch and process count.

    python benchmarks/loop_overhead.py --rounds 4 --steps 600 --skip 50
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
sys.path.insert(0, str(HERE.parent.parent))  # torchrun runs this file as a script


def worker(steps: int, out: str) -> None:
    """Run under torchrun: raytrain's loop on the dp_throughput workload."""
    import torch
    import torch.distributed as dist

    from benchmarks.dp_throughput import job_document
    from raytrain.core.resolve import job_layout
    from raytrain.spec import JobSpec
    from raytrain.train.loop import train
    from raytrain.train.progress import NullSink
    from raytrain.train.rank import WorkerInfo

    class StepTimes(NullSink):
        def __init__(self) -> None:
            self.points: list[tuple[int, float]] = []

        def progress(self, payload: dict[str, Any]) -> None:
            self.points.append((payload["step"], time.time()))

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    sink = StepTimes()
    with tempfile.TemporaryDirectory() as checkpoints:
        spec = JobSpec.model_validate(job_document(steps))
        train(spec, WorkerInfo.from_process_group(torch.device("cpu")), sink, Path(checkpoints),
              layout=job_layout(spec))
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"points": sink.points}))
    dist.destroy_process_group()


def torchrun(script_args: list[str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_port", "29533", *script_args],
        check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def main() -> None:
    from benchmarks.dp_throughput import run_torchrun, steady_tokens_per_s

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--skip", type=int, default=50)
    parser.add_argument("--worker", nargs=2, metavar=("STEPS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(int(args.worker[0]), args.worker[1])
        return
    ratios = []
    for round_index in range(args.rounds):
        reference = run_torchrun(args.steps, args.skip)
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "points.json"
            torchrun([str(HERE), "--worker", str(args.steps), str(out)])
            points = [tuple(p) for p in json.loads(out.read_text())["points"]]
        ours = steady_tokens_per_s(points, 16 * 64, args.skip)
        ratios.append(ours / reference)
        print(f"round {round_index + 1}: torchrun reference {reference:,.0f} tok/s, raytrain loop "
              f"{ours:,.0f} tok/s, ratio {ratios[-1]:.3f}", flush=True)
    print(f"raytrain loop / reference, median of paired ratios: {statistics.median(ratios):.3f} "
          f"{['%.3f' % r for r in ratios]}")


if __name__ == "__main__":
    main()
