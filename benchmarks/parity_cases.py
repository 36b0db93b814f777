"""How long each case of the parity tests' spawns takes (tests/ranks/test_parallel.py), with
the micro-batch size the tests give tensor-parallel cases (4) and the others' (2), side by
side.

    python -m benchmarks.parity_cases [--ranks 2 4] [--tp-micro-batch-size 4 2]

Each case's time is read from when its rank 0 wrote its losses (the cases run one after
another in one spawn, as in the tests); the first case also carries the spawn's start
(imports, process group). Prints one table per rank count.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import raytrain.testing.parity as parity


def cases(ranks: int, tp_micro_batch_size: int) -> list[tuple[str, dict, dict]]:
    """The layouts of `ranks`, each tensor-parallel one at `tp_micro_batch_size`."""
    layouts: dict[str, tuple[dict | None, dict[str, Any]]] = (
        {name: (None, p) for name, p in parity.TWO_RANKS.items()}
        | {name: (m, p) for name, (m, p) in parity.LLAMA_TWO_RANKS.items()}
        if ranks == 2 else {name: (None, p) for name, p in parity.FOUR_RANKS.items()})
    found = []
    for name, (model, parallel) in layouts.items():
        tensor = parallel.get("strategy") == "tensor" or parallel.get("tp", 1) > 1
        extra = {"micro_batch_size": tp_micro_batch_size} if tensor else {}
        found.append((name, parity.job(ranks, parallel, model, **extra), {}))
    return found


def timed(ranks: int, tp_micro_batch_size: int) -> list[tuple[str, float]]:
    out = Path(tempfile.mkdtemp())
    chosen = cases(ranks, tp_micro_batch_size)
    began = time.time()
    parity._spawn(ranks, chosen, out)  # noqa: SLF001 - the parity tests' own launcher
    times, previous = [], began
    for name, _, _ in chosen:
        done = os.path.getmtime(out / name / "losses.json")
        times.append((name, done - previous))
        previous = done
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], choices=[2, 4])
    parser.add_argument("--tp-micro-batch-size", type=int, nargs="+", default=[4, 2],
                        help="micro-batch sizes of tensor-parallel cases (4: the tests')")
    args = parser.parse_args(argv)
    for ranks in args.ranks:
        runs = {m: dict(timed(ranks, m)) for m in args.tp_micro_batch_size}
        names = list(next(iter(runs.values())))
        print(f"\n{ranks} ranks: seconds per case (tp cases at micro-batch size "
              f"{' / '.join(str(m) for m in runs)})")
        for name in names:
            print(f"  {name:28s} " + "  ".join(f"{runs[m][name]:6.2f}" for m in runs))
        print(f"  {'total':28s} " + "  ".join(f"{sum(runs[m].values()):6.2f}" for m in runs))


if __name__ == "__main__":
    main()
