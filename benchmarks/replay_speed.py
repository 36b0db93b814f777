"""How long `raytrain simulate` takes on a user's own trace: a single-node spot trace of
177 hours with outages of about 1.5 h (tests/support/replay_cases.outage_trace, seeded), the
default job (6 h of work, 12 h deadline) on one p3.2xlarge, with the cloud's notice and
without. With `--against DIR` (a checkout of an earlier commit, e.g. `git worktree add DIR
46ec4bb`), the same command from there too, one after the other, and the ratio.

    python -m benchmarks.replay_speed [--starts 44] [--processes 1] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from raytrain.testing.replay_cases import outage_trace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=11)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--against", type=Path, help="an earlier checkout to compare with")
    args = parser.parse_args()
    trace = outage_trace(hours=177.0, seed=11)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "aws-p3-177h.csv"
        path.write_text(f"# span_s: {trace.duration_s}\n" + "\n".join(
            f"{int(e.time_s * 1000)},{e.kind},{e.node}" for e in trace.events) + "\n")
        took = {}
        for name, root in (("this checkout", Path.cwd()), ("against", args.against)):
            if root is None:
                continue
            began = time.perf_counter()
            subprocess.run([sys.executable, "-m", "raytrain.cli", "simulate", "--trace",
                            str(path), "--nodes", "1", "--starts", str(args.starts),
                            "--notice-s", "cloud", "--notice-s", "0", "--processes",
                            str(args.processes), "--json"], check=True, cwd=root,
                           env={**os.environ, "PYTHONPATH": str(root)},
                           stdout=subprocess.DEVNULL)
            took[name] = time.perf_counter() - began
            print(f"{name} ({root}): 177-hour single-node trace, {len(trace.events)} events, "
                  f"{args.starts} starts x 2 notices, {args.processes} process(es): "
                  f"{took[name]:.1f} s ({took[name] / (2 * args.starts):.2f} s per start)",
                  flush=True)
    if len(took) == 2:
        print(f"ratio: {took['against'] / took['this checkout']:.2f}x faster")

if __name__ == "__main__":
    main()
