"""How long a checkpoint stops training, saved synchronously against in the background, for
a model of over 100M parameters with its AdamW state, to a local folder and to an S3 server
on 127.0.0.1 (moto's server, in a process of its own, spoken to through boto3 over HTTP).

    python -m benchmarks.checkpoint_stall [--params-m 110] [--saves 3]

For each store and mode it saves `--saves` times through raytrain.train.checkpoint's
CheckpointManager (the training loop's own), waiting for each to be committed before the
next, and prints the stall (what save() took on the training thread) and the time until the
checkpoint was committed, with the ratio of the asynchronous stall to the synchronous one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from raytrain.train.checkpoint import CheckpointManager


def _model(params_m: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    width = 2048
    layers = max(1, round(params_m * 1e6 / (4 * width * width + 3 * width)))
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, 2 * width),
                                                      torch.nn.Linear(2 * width, width))
                                  for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    return model, optimizer, sum(p.numel() for p in model.parameters())


def _measure(root: str, asynchronous: bool, saves: int, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer) -> tuple[list[float], list[float]]:
    durable: list[float] = []
    manager = CheckpointManager(root, 0, keep=1, asynchronous=asynchronous,
                                on_durable=lambda step, ref, stall, d: durable.append(d))
    stalls = []
    for step in range(1, saves + 1):
        stall = manager.save(step, [model], [optimizer], {"bench": True})
        assert stall is not None
        stalls.append(stall)
        manager.flush()
    return stalls, durable


def _s3_server() -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": endpoint})
    import boto3

    deadline = time.monotonic() + 60
    while True:
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
            return server, endpoint
        except Exception:  # not up yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-m", type=int, default=110)
    parser.add_argument("--saves", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model, optimizer, params = _model(args.params_m)
    size_gb = 3 * params * 4 / 1e9
    print(f"model: {params / 1e6:.0f}M parameters, {size_gb:.2f} GB with AdamW's state; "
          f"{args.saves} saves each; torch threads {torch.get_num_threads()}")
    server, endpoint = _s3_server()
    try:
        with tempfile.TemporaryDirectory() as folder:
            stores = {"local disk": str(Path(folder) / "ckpt"),
                      f"S3 ({endpoint}, moto)": "s3://bench/ab12/checkpoints"}
            print("| store | mode | stall s (median) | committed after s (median) | "
                  "async stall / sync stall |")
            print("|---|---|---|---|---|")
            for name, root in stores.items():
                sync_stall, sync_durable = _measure(root, False, args.saves, model, optimizer)
                async_stall, async_durable = _measure(root, True, args.saves, model,
                                                      optimizer)
                ratio = statistics.median(async_stall) / statistics.median(sync_stall)
                for mode, stall, durable in (("synchronous", sync_stall, sync_durable),
                                             ("background", async_stall, async_durable)):
                    print(f"| {name} | {mode} | {statistics.median(stall):.2f} | "
                          f"{statistics.median(durable):.2f} | "
                          f"{ratio:.2f} |" if mode == "background" else
                          f"| {name} | {mode} | {statistics.median(stall):.2f} | "
                          f"{statistics.median(durable):.2f} | |")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
