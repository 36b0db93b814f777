"""The reference: a plain torchrun DDP script of the same model, data, batch and process count.

Deliberately written without raytrain's loop: AdamW (torch's default multi-tensor kernel;
`--fused` for the fused one raytrain uses), gradient accumulation with no_sync, gradient
clipping, a fixed learning rate, and a timestamp per step on rank 0. It writes the step
timestamps as JSON so the caller measures throughput the same way for both.

    torchrun --nproc_per_node 2 benchmarks/torchrun_ddp.py --steps 300 --out times.json [--fused]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from raytrain.data.sources import SyntheticTokens
from raytrain.models.gpt import GPT
from raytrain.spec import GPTConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--out", required=True)
    parser.add_argument("--fused", action="store_true", help="fused AdamW, as raytrain's loop")
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=256, dim=args.dim, num_layers=args.layers, num_heads=4,
                       max_seq_len=args.seq_len)
    model = DistributedDataParallel(GPT(config))
    kernel = {"fused": True} if args.fused else {"foreach": True}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, **kernel)
    data = SyntheticTokens(256, args.seq_len, seed=0)
    accum = args.global_batch // (args.micro_batch * world)
    step_times = []
    for step in range(args.steps):
        for micro in range(accum):
            start = step * args.global_batch + (micro * world + rank) * args.micro_batch
            tokens = data.batch(range(start, start + args.micro_batch))
            sync = model.no_sync() if micro < accum - 1 else nullcontext()
            with sync:
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()) / accum
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            loss.item()
            step_times.append(time.time())
    if rank == 0:
        with open(args.out, "w") as handle:
            json.dump({"step_times": step_times,
                       "tokens_per_step": args.global_batch * args.seq_len}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
