"""How long a Ray Train fit takes, start to end, at Ray's default controller poll (every
2 s) and at the one raytrain's runner sets (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 0.5 s), side by
side in one local Ray session.

    python -m benchmarks.fit_poll [--rounds 3] [--workers 2]

Each fit is a worker group of `--workers` ranks (gloo) whose training function sleeps 0.2 s:
what is left is Ray Train's start, its polls and its shutdown. The two settings alternate over
`--rounds`, so both see the same machine; the figure is the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

INTERVALS = {"Ray's default (2 s)": "2.0", "raytrain's runner (0.5 s)": "0.5"}


def one_fit(workers: int) -> float:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train() -> None:  # defined here: pickled by value, so the workers need no import
        time.sleep(0.2)

    started = time.monotonic()
    TorchTrainer(train,
                 scaling_config=ScalingConfig(num_workers=workers,
                                              resources_per_worker={"CPU": 2 / workers}),
                 run_config=RunConfig(failure_config=FailureConfig(max_failures=0))).fit()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    one_fit(args.workers)  # warm: the first fit imports what the others reuse
    took: dict[str, list[float]] = {name: [] for name in INTERVALS}
    for _ in range(args.rounds):
        for name, interval in INTERVALS.items():
            os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = interval  # read at each fit
            took[name].append(one_fit(args.workers))
    ray.shutdown()
    base = statistics.median(took["Ray's default (2 s)"])
    print(f"| controller poll | fit s (median of {args.rounds}) | each | ratio |")
    print("|---|---:|---|---:|")
    for name, seconds in took.items():
        median = statistics.median(seconds)
        print(f"| {name} | {median:.2f} | {', '.join(f'{s:.2f}' for s in seconds)} | "
              f"{median / base:.3f} |")


if __name__ == "__main__":
    main()
