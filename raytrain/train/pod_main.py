"""A job's training on one pod that is no Ray node, driven by the service over SSH: what runs
on the pod (`python -m raytrain.train.pod_main`).

RunPod's interruptible pods cannot reach the head's private network (raytrain.cloud.runpod),
so the service starts this over the pod's public SSH (raytrain.cloud.pod_runs), as `ray up`
reaches a head and as SkyPilot and dstack drive GPU clouds. It trains the job with the same
loop as every other job (raytrain.train.loop, which knows nothing of Ray): one process per
rank on the pod's devices (NCCL on GPUs, gloo on CPUs), checkpoints to the job's storage
(a bucket, or a folder the pod mounts), its output to the job's logs there.

The service and this process speak JSON lines over the SSH session (LINE_PREFIX marks ours on
stdout; anything else there is a library's output). In: the run's config first
(`{"job_id", "env", "spec", "layout", "checkpoint_root", "log_uri", "threads"}`; `env`: the
job storage's endpoint and credentials), then the service's
answers (`{"kind": "started", "attempt": N}`, `{"kind": "reply", "stop", "move",
"checkpoint_every_s"}`). Out: what rank 0's sink says (`started`, `progress`, `checkpoint`,
`finished`), and `failed` with the error if a rank raises. The end of the input (the service
gone, or stopping the run) stops every rank.

Written by hand: torchrun starts ranks but gives no channel back to a service, and Ray is
what this pod cannot join.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import sys
import threading
import traceback
from typing import Any, TextIO

from raytrain.train.progress import AnsweredSink

LINE_PREFIX = "@raytrain "


def main() -> int:
    channel = os.fdopen(os.dup(1), "w", buffering=1)  # ours: ranks' output goes to the logs
    config = json.loads(sys.stdin.readline())
    os.environ.update(config.pop("env", {}))  # the job's storage (its bucket's credentials)
    import torch.multiprocessing as mp

    from raytrain.spec import Layout

    world_size = Layout(**config["layout"]).world_size
    with socket.socket() as sock:  # the ranks' rendezvous, on this pod only
        sock.bind(("127.0.0.1", 0))
        config["port"] = sock.getsockname()[1]
    context = mp.get_context("spawn")
    outbox, replies = context.Queue(), context.Queue()
    ranks = [context.Process(target=_rank, args=(rank, world_size, config, outbox,
                                                  replies if rank == 0 else None),
                             daemon=True) for rank in range(world_size)]
    for process in ranks:
        process.start()
    threading.Thread(target=_read_answers, args=(sys.stdin, replies, ranks),
                     daemon=True).start()
    return _relay(outbox, ranks, channel)


def _read_answers(stdin: TextIO, replies: Any, ranks: list[Any]) -> None:
    """The service's answers, to rank 0; the end of the input stops every rank."""
    for line in stdin:
        if line.strip():
            replies.put(json.loads(line))
    for process in ranks:
        if process.is_alive():
            process.terminate()


def _relay(outbox: Any, ranks: list[Any], channel: TextIO) -> int:
    """Rank 0's messages to the service, until every rank has ended; the exit status."""
    failed = False
    while True:
        try:
            message = outbox.get(timeout=0.5)
        except queue.Empty:
            if all(not p.is_alive() for p in ranks):
                break
            dead = [p for p in ranks if p.exitcode not in (None, 0)]
            if dead and not failed:
                failed = True
                channel.write(LINE_PREFIX + json.dumps({
                    "kind": "failed", "error": f"rank {ranks.index(dead[0])} exited with "
                    f"{dead[0].exitcode}"}) + "\n")
                for process in ranks:
                    if process.is_alive():
                        process.terminate()
            continue
        failed = failed or message.get("kind") == "failed"
        channel.write(LINE_PREFIX + json.dumps(message) + "\n")
    return 1 if failed or any(p.exitcode for p in ranks) else 0


def _rank(rank: int, world_size: int, config: dict[str, Any], outbox: Any,
          replies: Any) -> None:
    import torch
    import torch.distributed as dist

    from raytrain.spec import JobSpec, Layout
    from raytrain.train.loop import train
    from raytrain.train.progress import NullSink, ProgressSink
    from raytrain.train.rank import WorkerInfo
    from raytrain.train.worker_logs import stored_output

    torch.set_num_threads(int(config.get("threads", 1)))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    spec = JobSpec.model_validate(config["spec"])
    layout = Layout(**config["layout"])
    with stored_output(config["log_uri"], rank, f"job {config['job_id']} on a pod, "
                       f"world size {world_size}"):
        try:
            if world_size > 1:
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", str(config["port"]))
                dist.init_process_group("nccl" if cuda else "gloo", rank=rank,
                                        world_size=world_size)
            worker = WorkerInfo(rank, world_size, device)
            sink: ProgressSink = PodSink(outbox, replies) if rank == 0 else NullSink()
            train(spec, worker, sink, config["checkpoint_root"], layout=layout)
        except BaseException as exc:
            traceback.print_exc()
            if rank == 0:
                outbox.put({"kind": "failed", "error": f"{type(exc).__name__}: {exc}"})
            raise
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


class PodSink(AnsweredSink):
    """Rank 0's sink on a pod: its reports go out as lines, the service's answers come back
    as lines. `started` waits for the run's attempt, as the Ray sink waits for the manager."""

    def __init__(self, outbox: Any, replies: Any) -> None:
        from raytrain.train.progress import ServiceAnswer

        self.outbox, self.replies = outbox, replies
        self.answer = ServiceAnswer()

    def _poll(self) -> None:
        while True:
            try:
                message = self.replies.get_nowait()
            except queue.Empty:
                return
            if message.get("kind") == "reply":
                self.answer.take(message)

    def started(self, resumed_step: int) -> None:
        self.outbox.put({"kind": "started", "step": resumed_step})
        while True:
            message = self.replies.get()
            if message.get("kind") == "started":
                self.answer.stop = int(message.get("attempt", 0)) < 0
                return
            if message.get("kind") == "reply":
                self.answer.take(message)

    def progress(self, payload: dict[str, Any]) -> None:
        self._poll()
        self.outbox.put({"kind": "progress", "payload": payload})

    def checkpoint(self, step: int, path: str, save_s: float,
                   durable_s: float | None = None) -> None:
        self.outbox.put({"kind": "checkpoint", "step": step, "path": path, "save_s": save_s,
                         "durable_s": durable_s})

    def finished(self, result: dict[str, Any]) -> None:
        self.outbox.put({"kind": "finished", "result": result})



if __name__ == "__main__":
    sys.exit(main())
