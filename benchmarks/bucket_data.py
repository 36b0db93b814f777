"""Token shards from a bucket against the same shards in a folder: the same job on each, side
by side in one run, against moto's S3 server on 127.0.0.1 (requests cross HTTP and boto3,
not a network: a real bucket adds its latency, which the prefetcher hides while a step lasts
longer than a batch's GETs). The bucket twice: cold (every window fetched into the node's
disk cache, an empty folder here) and warm (the same run again: read from the cache). Prints
each run's time per step, the first step's wait for its data, the mean wait (`data_s`), and
the ratios to the folder.

    python -m benchmarks.bucket_data [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from raytrain.cloud.object_store import open_store
from raytrain.spec import JobSpec
from tests.support.runs import run_single
from tests.support.s3_server import make_bucket, s3_server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
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
        for where, path in (("folder", str(folder)), ("cold", "s3://data/corpus"),
                            ("warm", "s3://data/corpus")):
            spec = JobSpec.model_validate({
                "model": {"gpt": {"vocab_size": 8192, "dim": 128, "num_layers": 2,
                                  "num_heads": 4, "max_seq_len": 256}},
                "data": {"kind": "token_file", "path": path, "seq_len": 256, "shuffle": True},
                "training": {"steps": args.steps, "global_batch_size": 16,
                             "micro_batch_size": 8, "learning_rate": 0.001},
                "resources": {"num_workers": 1}})
            began = time.perf_counter()
            sink = run_single(spec, Path(tmp) / where)
            took = time.perf_counter() - began
            waits = [r["data_s"] for r in sink.reports if r.get("data_s") is not None]
            rows.append((where, took / args.steps, waits[0], float(np.mean(waits)),
                         sink.losses()[args.steps]))
        for where, per_step, first, data_s, loss in rows:
            print(f"{where:7s} {per_step * 1000:8.1f} ms a step   first step's wait "
                  f"{first * 1000:6.2f} ms   data_s {data_s * 1000:6.2f} ms   "
                  f"final loss {loss:.6f}   {per_step / rows[0][1]:.3f}x the folder")
        print(f"same final loss: {len({row[4] for row in rows}) == 1}")


if __name__ == "__main__":
    main()
