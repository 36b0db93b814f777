"""Token shards from a bucket against the same shards in a folder: the same job on each, side
by side in one run, against moto's S3 server on 127.0.0.1 (requests cross HTTP and boto3,
not a network: a real bucket adds its latency, which the prefetcher hides while a step lasts
longer than a batch's GETs). The bucket twice: cold (every window fetched into the node's
disk cache, an empty folder here) and warm (the same run again: read from the cache). Prints
each run's time a step (its compute and its wait for data, from the reports, the run's start
left out), the first step's wait for its data, the mean wait (`data_s`), and the ratios to
the folder.

    python -m benchmarks.bucket_data [--steps 40] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from raytrain.cloud.object_store import open_store
from raytrain.spec import JobSpec
from raytrain.testing.runs import run_single
from raytrain.testing.s3_server import make_bucket, s3_server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2, help="runs of the folder and the "
                        "warm cache each, in turns")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, s3_server() as endpoint:
        make_bucket(endpoint, "data")
        folder = Path(tmp) / "shards"
        folder.mkdir()
        shards = []
        rng = np.random.default_rng(0)
        for n in range(4):
            tokens = rng.integers(0, 8192, size=250_000, dtype=np.uint16)
            (folder / f"shard-{n:05d}.bin").write_bytes(tokens.tobytes())
            shards.append({"file": f"shard-{n:05d}.bin", "tokens": len(tokens)})
        (folder / "index.json").write_text(json.dumps(
            {"version": 1, "dtype": "uint16", "vocab_size": 8192, "tokens": 1_000_000,
             "shards": shards}))
        bucket = open_store("s3://data/corpus")
        for path in folder.iterdir():
            bucket.put_file(path, path.name)
        os.environ["RAYTRAIN_DATA_CACHE"] = str(Path(tmp) / "cache")
        rows = []
        # Cold first; then the folder and the warm cache in turns, so that a drift of the
        # host's speed falls on both alike.
        runs = [("cold", "s3://data/corpus")] + [("folder", str(folder)),
                                                 ("warm", "s3://data/corpus")] * args.repeat
        for number, (where, path) in enumerate(runs):
            spec = JobSpec.model_validate({
                "model": {"gpt": {"vocab_size": 8192, "dim": 128, "num_layers": 2,
                                  "num_heads": 4, "max_seq_len": 256}},
                "data": {"kind": "token_file", "path": path, "seq_len": 256, "shuffle": True},
                "training": {"steps": args.steps, "global_batch_size": 16,
                             "micro_batch_size": 8, "learning_rate": 0.001},
                "resources": {"num_workers": 1}})
            sink = run_single(spec, Path(tmp) / f"run-{number}")  # each from step 0
            # A step's time on the critical path: its compute and its wait for data, as
            # each report (one a step here) measured them; the run's start is left out (a
            # bucket's client, the index's GET).
            reports = [r for r in sink.reports if r.get("data_s") is not None]
            per_step = float(np.mean([r["step_s"] + r["data_s"] for r in reports[1:]]))
            rows.append((where, per_step, reports[0]["data_s"],
                         float(np.mean([r["data_s"] for r in reports])),
                         sink.losses()[args.steps]))
        for where, per_step, first, data_s, loss in rows:
            print(f"{where:7s} {per_step * 1000:8.1f} ms a step   first step's wait "
                  f"{first * 1000:6.2f} ms   data_s {data_s * 1000:6.2f} ms   "
                  f"final loss {loss:.6f}")

        def mean(where: str) -> float:
            return float(np.mean([row[1] for row in rows if row[0] == where]))

        print(f"time a step against the folder: cold {mean('cold') / mean('folder'):.3f}x, "
              f"warm {mean('warm') / mean('folder'):.3f}x; same final loss: "
              f"{len({row[4] for row in rows}) == 1}")


if __name__ == "__main__":
    main()
