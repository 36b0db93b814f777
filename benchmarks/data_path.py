"""The data a step needs, and whether the step waits for it: one 4 x 2,049 synthetic batch
(the GPU truth table's micro-batch) built position by position, as the source did, against
the vectorised build, side by side on this machine; and the seconds a step of a given
length waits for its data with the read-ahead of raytrain.data.prefetch.

    python benchmarks/data_path.py [--vocab 50304] [--seq 2048] [--micro 4] [--step-ms 150]
"""

from __future__ import annotations

import argparse
import time

import torch

from raytrain.core.batching import BatchPlan
from raytrain.data.prefetch import Prefetcher
from raytrain.data.sources import SyntheticTokens
from raytrain.testing.data import stepped


def best_ms(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return 1000 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=150.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    source = SyntheticTokens(args.vocab, args.seq, seed=0)
    rows = list(range(args.micro))
    assert torch.equal(source.batch(rows), stepped(source, rows))
    old, new = best_ms(lambda: stepped(source, rows)), best_ms(lambda: source.batch(rows))
    print(f"batch {args.micro} x {args.seq + 1}: stepped {old:.1f} ms, vectorised {new:.2f} ms "
          f"({old / new:.0f}x)")
    plan = BatchPlan(args.micro * 4, args.micro, 1)
    data = Prefetcher(source, plan, 0, torch.device("cpu"))
    waits = []
    for step in range(20):
        began = time.perf_counter()
        data.get(step, [0, 1, 2, 3])
        waits.append(time.perf_counter() - began)
        time.sleep(args.step_ms / 1000)  # the step's compute
    data.close()
    print(f"read ahead, steps of {args.step_ms:.0f} ms: the step waits {1000 * waits[0]:.1f} ms "
          f"for its first batch, then at most {1000 * max(waits[1:]):.2f} ms")


if __name__ == "__main__":
    main()
