"""The step time of a CPU job with tracking on (MLflow, a real `mlflow server` on 127.0.0.1,
and TensorBoard's event files) against the same job with none, side by side on one local
service (2 CPUs, Ray), the jobs one after the other, in turns (off, on, on, off, ...): the
job manager sends the runs every 2 s from the history it keeps, off the workers' path. Prints
each job's tokens/s (its result's: steps x tokens over its training wall time) and the ratio
on to off. `--repeat` pairs of jobs (even: as many of each in each position).

    python -m benchmarks.tracking_overhead [--steps 300] [--repeat 4]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from benchmarks.local_service import start, stop
    from raytrain import Client
    from raytrain.testing.mlflow_server import MlflowServer
    from raytrain.testing.ray_service import job_spec

    with tempfile.TemporaryDirectory() as tmp:
        server = MlflowServer(Path(tmp) / "mlflow").start()
        url, token, _ = start(prefix="raytrain-tracking-")
        rows = []
        try:
            with Client(url, token=token) as client:
                # off, on, on, off, ...: a drift of the host's speed over the runs falls on
                # both alike
                for turn in range(args.repeat * 2):
                    tracked = turn % 4 in (1, 2)
                    spec = job_spec(args.steps, checkpoint_every=100,
                                    name="tracked" if tracked else "plain")
                    if tracked:
                        spec["tracking"] = {"mlflow": {"tracking_uri": server.url},
                                            "tensorboard": {}}
                    job = client.submit(spec)
                    while not (status := client.get(job.id)).state.is_terminal:
                        time.sleep(1.0)
                    assert status.state.value == "SUCCEEDED", status.error
                    assert status.result is not None
                    if tracked:  # the run got every step
                        while not (status := client.get(job.id)).tracking.runs[
                                "mlflow"].ended:
                            time.sleep(1.0)
                    rows.append((tracked, status.result.tokens_per_s))
        finally:
            stop()
            server.stop()
    for tracked, tokens_per_s in rows:
        print(f"{'tracking on ' if tracked else 'tracking off'}  {tokens_per_s:10,.0f} tokens/s")
    on = np.mean([r[1] for r in rows if r[0]])
    off = np.mean([r[1] for r in rows if not r[0]])
    print(f"tokens/s, tracking on / off: {on / off:.3f}  (step time on / off: {off / on:.3f})")


if __name__ == "__main__":
    main()
