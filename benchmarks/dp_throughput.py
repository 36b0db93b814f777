"""Data-parallel throughput of a raytrain job against plain torchrun, side by side in one run.

Prints steady-state tokens/s of (a) a raytrain job submitted over HTTP to the service on a
local Ray (2 Ray Train workers, gloo, progress reporting on) and (b) benchmarks/torchrun_ddp.py
(2 processes, same model, data, batch), alternating rounds, and their ratio. Also prints the
time from POST to the first training step, cold (first job on a fresh cluster) and warm.

Steady state is measured between two progress reports (raytrain) or two step timestamps
(torchrun) that skip the first `--skip` steps, so start-up is excluded from both.

    python benchmarks/dp_throughput.py --rounds 5 --steps 600 --skip 50 [--unwatched]
        [--fused-reference]

The reference is a plain DDP script with torch's default AdamW (multi-tensor); raytrain's loop
uses the fused AdamW kernel. `--fused-reference` adds a third run per round, the reference
with the fused kernel too, so the cost of Ray and the service shows on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from raytrain.client import Client
from raytrain.serve.deploy import connect_ray, deploy, port_is_free, undeploy
from raytrain.serve.http.auth import operator_token
from raytrain.spec import ServiceConfig


def job_document(steps: int) -> dict:
    return {
        "name": "bench-dp",
        "model": {"gpt": {"vocab_size": 256, "dim": 128, "num_layers": 2, "num_heads": 4,
                          "max_seq_len": 64}},
        "data": {"seq_len": 64},
        "training": {"steps": steps, "global_batch_size": 16, "micro_batch_size": 4,
                     "checkpoint_every_steps": steps, "learning_rate": 0.003},
        "resources": {"num_workers": 2, "cpus_per_worker": 1},
    }


def steady_tokens_per_s(points: list[tuple[int, float]], tokens_per_step: int, skip: int) -> float:
    """Throughput between the first point past `skip` steps and the last point."""
    window = [(step, t) for step, t in points if step > skip]
    (step_a, t_a), (step_b, t_b) = window[0], window[-1]
    return (step_b - step_a) * tokens_per_step / (t_b - t_a)


def run_raytrain(client: Client, steps: int, skip: int, follow: bool) -> tuple[float, float]:
    """One job; `follow` streams its events live, else it polls every 5 s and reads the
    stream once the job has ended (the workers report progress either way)."""
    posted = time.time()
    job = client.submit(job_document(steps))
    if not follow:
        while not job.status().state.is_terminal:
            time.sleep(5)
    points = [(e.data["step"], e.data["sent_at"]) for e in job.events() if e.type == "progress"]
    status = job.status()
    assert status.state.value == "SUCCEEDED", status.error
    first_step_s = points[0][1] - posted
    return steady_tokens_per_s(points, 16 * 64, skip), first_step_s


def run_torchrun(steps: int, skip: int, fused: bool = False) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_port", "29531", str(Path(__file__).with_name("torchrun_ddp.py")),
             "--steps", str(steps), "--out", str(out)] + (["--fused"] if fused else []),
            check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        record = json.loads(out.read_text())
    points = [(i + 1, t) for i, t in enumerate(record["step_times"])]
    return steady_tokens_per_s(points, record["tokens_per_step"], skip)


def print_series(name: str, values: list[float]) -> None:
    print(f"{name} median {statistics.median(values):,.0f} tokens/s  "
          f"{['%.0f' % v for v in values]}")


def print_paired(name: str, values: list[float], against: list[float]) -> None:
    """Round-by-round ratios of `values` over `against`, and their median."""
    paired = [v / a for v, a in zip(values, against)]
    print(f"paired ratios {name}: {['%.3f' % r for r in paired]}; "
          f"median {statistics.median(paired):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip", type=int, default=30)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--unwatched", action="store_true",
                        help="also run each round's job with nobody following its events")
    parser.add_argument("--fused-reference", action="store_true",
                        help="also run the reference with fused AdamW, raytrain's optimizer "
                             "kernel: the ratio against it is the cost of Ray and the service "
                             "alone")
    args = parser.parse_args()
    if not port_is_free("127.0.0.1", args.port):
        sys.exit(f"port {args.port} is busy; pass --port")

    started = time.monotonic()
    connect_ray(None, num_cpus=2, quiet=True)
    with tempfile.TemporaryDirectory() as state_dir:
        config = ServiceConfig(state_dir=state_dir)
        url = deploy(config, "127.0.0.1", args.port)
        print(f"service ready {time.monotonic() - started:.1f} s after start", flush=True)
        client = Client(url, token=operator_token(config))
        ours, reference, first_steps, unwatched, fused = [], [], [], [], []
        try:
            for round_index in range(args.rounds):
                reference.append(run_torchrun(args.steps, args.skip))
                tps, first_step_s = run_raytrain(client, args.steps, args.skip, follow=True)
                ours.append(tps)
                first_steps.append(first_step_s)
                line = (f"round {round_index + 1}: torchrun {reference[-1]:,.0f} tok/s, raytrain "
                        f"followed {ours[-1]:,.0f} tok/s")
                if args.fused_reference:
                    fused.append(run_torchrun(args.steps, args.skip, fused=True))
                    line += f", torchrun fused AdamW {fused[-1]:,.0f} tok/s"
                if args.unwatched:
                    unwatched.append(run_raytrain(client, args.steps, args.skip, follow=False)[0])
                    line += f", unwatched {unwatched[-1]:,.0f} tok/s"
                print(f"{line}, POST to first step {first_step_s:.1f} s", flush=True)
        finally:
            undeploy(stop_jobs=True)
    # Each raytrain run is paired with the torchrun run just before it; the median of the
    # paired ratios cancels the slow drift of a shared machine better than a ratio of medians.
    paired = [r / t for r, t in zip(ours, reference)]
    ratio = statistics.median(paired)
    print()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print(f"workload: GPT dim 128 x 2 layers, seq 64, global batch 16 (2 ranks x 4 x accum 2), "
          f"{args.steps} steps, steady state after step {args.skip}")
    print_series("torchrun DDP  ", reference)
    print_series("raytrain job  ", ours)
    print(f"paired ratios raytrain / torchrun: {['%.3f' % r for r in paired]}")
    print(f"ratio raytrain / torchrun (median of paired): {ratio:.3f}; "
          f"ratio of medians: {statistics.median(ours) / statistics.median(reference):.3f}")
    if fused:
        print_series("torchrun DDP, fused AdamW", fused)
        print_paired("raytrain / torchrun fused AdamW", ours, fused)
    if unwatched:
        print_series("raytrain unwatched", unwatched)
        print_paired("unwatched / torchrun", unwatched, reference)
    print(f"POST to first training step: cold {first_steps[0]:.1f} s, warm "
          f"{statistics.median(first_steps[1:]) if len(first_steps) > 1 else float('nan'):.1f} s")


if __name__ == "__main__":
    main()
