"""Run a job's training on Ray Train V2 workers: one `TorchTrainer.fit()` per job.

Ray Train owns the worker group, the process group (NCCL when workers have GPUs, gloo when
not) and placement. A failed group ends the fit: the job manager decides whether to start
another (raytrain.core.lifecycle.handlers, `worth_retrying`). The loop itself is
raytrain.train.loop; checkpoints are raytrain's own (see raytrain.train.checkpoint), so after a
restart the loop finds the latest committed one by itself.

Rank 0 publishes progress to the job manager actor named in the config; other ranks stay quiet.
A job's run (rigid here, or as replica groups: raytrain.train.elastic_launcher) is started by
raytrain.train.runs.

    build_trainer(spec, layout, job_id="ab12", checkpoint_root=..., run_root=...,
                  manager=("raytrain", "raytrain-job-manager")).fit()
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import ray
import ray.train
import ray.train.torch
import ray.util
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raytrain.cloud.interruption import Ec2Metadata, Watcher
from raytrain.cloud.object_store import join, parent
from raytrain.spec import JobSpec, Layout
from raytrain.train.loop import train
from raytrain.train.progress import AnsweredSink, NullSink, ProgressSink, ServiceAnswer
from raytrain.train.rank import WorkerInfo
from raytrain.train.worker_logs import stored_output

logger = logging.getLogger(__name__)

NODE_ID_LABEL = "ray.io/node-id"  # a label Ray gives every node: its id


class ManagerSink(AnsweredSink):
    """Progress of one job's rank 0, sent to the job manager actor.

    Progress is fire-and-forget (the training step never waits for it); `started`, checkpoint
    and finish notices wait for the manager, since state transitions hang on them. Each
    message carries the attempt number the manager handed out in `started`, so a late message
    from an earlier attempt cannot move the job backwards.
    """

    def __init__(self, manager: Any, job_id: str, placement: dict[str, Any],
                 attempt: int | None = None) -> None:
        """`attempt`: the run's, when its start was reported already (an elastic job's
        runner reports it once for all its replica groups)."""
        self.manager = manager
        self.job_id = job_id
        self.placement = placement
        self.attempt = attempt or 0
        self._report_start = attempt is None
        self._last_reply: ray.ObjectRef | None = None
        self.answer = ServiceAnswer()

    def started(self, resumed_step: int) -> None:
        if not self._report_start:
            return
        self.attempt = ray.get(
            self.manager.worker_group_started.remote(self.job_id, resumed_step, self.placement)
        )
        self.answer.stop = self.attempt < 0  # the job was cancelled while the group started

    def progress(self, payload: dict[str, Any]) -> None:
        sent = {**payload, "sent_at": time.time()}
        self._poll()
        self._last_reply = self.manager.report_progress.remote(self.job_id, self.attempt, sent)

    def _poll(self) -> None:
        """Read the manager's answer to the last report if it has come; never waits."""
        if self._last_reply is None:
            return
        ready, _ = ray.wait([self._last_reply], timeout=0)
        if ready:
            self.answer.take(ray.get(ready[0]))
            self._last_reply = None

    def checkpoint(self, step: int, path: str, save_s: float,
                   durable_s: float | None = None) -> None:
        ray.get(self.manager.report_checkpoint.remote(self.job_id, self.attempt, step, path,
                                                      save_s, durable_s))

    def finished(self, result: dict[str, Any]) -> None:
        ray.get(self.manager.report_finished.remote(self.job_id, self.attempt, result))


def train_fn_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker entry point."""
    torch.set_num_threads(config["threads_per_worker"])
    context = ray.train.get_context()
    spec: JobSpec = config["spec"]  # validated once, where the job came in
    layout: Layout = config["layout"]  # resolved once, at submit: not planned again here
    worker = WorkerInfo(
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        device=ray.train.torch.get_device(),
    )
    sink: ProgressSink = NullSink()
    if worker.rank == 0:
        namespace, name = config["manager"]
        group = ray.util.get_current_placement_group()
        placement = {
            "placement_group": group.id.hex() if group is not None else None,
            "accelerator": _accelerator_name(worker.device),
            "nodes": max(1, worker.world_size // max(1, context.get_local_world_size())),
        }
        sink = ManagerSink(ray.get_actor(name, namespace=namespace), config["job_id"], placement)
    endpoint = node_endpoint(config.get("interruption_endpoint"))
    header = (f"job {config['job_id']}, world size {worker.world_size}, "
              f"node {ray.get_runtime_context().get_node_id()[:12]}")
    with stored_output(config["log_dir"], worker.rank, header), \
            watching(endpoint) as watcher:
        train(spec, worker, sink, config["checkpoint_root"], notices=watcher, layout=layout)


@contextmanager
def watching(endpoint: str | None) -> Iterator[Watcher | None]:
    """The node's interruption watcher while a worker trains (None without an endpoint);
    a failure's traceback goes to the rank's log (the error itself travels to the job's
    status through Ray, and is logged once there)."""
    watcher = Watcher(Ec2Metadata(endpoint)).start() if endpoint else None
    try:
        yield watcher
    except Exception:
        traceback.print_exc()
        raise
    finally:
        if watcher is not None:
            watcher.stop()


def node_endpoint(endpoint: str | None) -> str | None:
    """The metadata endpoint for this worker's node ('{node}': its Ray node id)."""
    if endpoint is None or "{node}" not in endpoint:
        return endpoint
    return endpoint.replace("{node}", ray.get_runtime_context().get_node_id())


def _accelerator_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def threads_per_worker(spec: JobSpec) -> int:
    return max(1, int(spec.resources.cpus_per_worker))


def build_trainer(
    spec: JobSpec,
    layout: Layout,
    job_id: str,
    checkpoint_root: str,
    run_root: Path,
    manager: tuple[str, str],
    worker_resources: dict[str, float] | None = None,
    interruption_endpoint: str | None = None,
    train_fn: Any = None,
    extra_config: dict[str, Any] | None = None,
    name: str | None = None,
    avoid_nodes: list[str] | None = None,
) -> TorchTrainer:
    """worker_resources: custom resources each worker also asks for (the share of a bought
    node type's resource that pins the worker to those nodes). A failed worker group is never
    restarted by Ray Train: it is handed back to the job manager, which tells a preempted
    node from a real error and a retry that could succeed from one that cannot.
    interruption_endpoint: the instance metadata service every worker watches for spot
    notices (None: none). avoid_nodes: Ray node ids no worker may be placed on."""
    resources = spec.resources
    per_worker: dict[str, float] = {"CPU": resources.cpus_per_worker, **(worker_resources or {})}
    if resources.use_gpu:
        per_worker["GPU"] = resources.gpus_per_worker
    threads = threads_per_worker(spec)
    return TorchTrainer(
        train_fn or train_fn_per_worker,
        train_loop_config={
            "layout": layout,
            **(extra_config or {}),
            "spec": spec,
            "job_id": job_id,
            "checkpoint_root": str(checkpoint_root),
            "log_dir": join(parent(checkpoint_root), "logs"),
            "manager": list(manager),
            "threads_per_worker": threads,
            "interruption_endpoint": interruption_endpoint,
        },
        # Ray Train v2's configs (RAY_TRAIN_V2_ENABLED); mypy reads v1's, which lack these.
        scaling_config=ScalingConfig(  # type: ignore[call-arg]
            num_workers=resources.num_workers,
            use_gpu=resources.use_gpu,
            resources_per_worker=per_worker,
            # Every Ray node carries its id as the default label "ray.io/node-id".
            label_selector={NODE_ID_LABEL: f"!in({','.join(sorted(avoid_nodes))})"}
            if avoid_nodes else None,
        ),
        run_config=RunConfig(  # type: ignore[call-arg]
            name=name or f"job-{job_id}",
            storage_path=str(run_root),
            failure_config=FailureConfig(  # type: ignore[call-arg]
                max_failures=0,
                controller_failure_limit=0,
            ),
            worker_runtime_env={"env_vars": {
                "OMP_NUM_THREADS": str(threads),
                # Ray starts worker processes at nice 15, below its own daemons. Training ranks
                # run at normal priority instead, so Ray's and the service's actors (still at
                # 15) yield to them when the node's cores are busy, and a rank is not stalled
                # behind control-plane work while its peers wait at the next collective.
                "RAY_worker_niceness": "0",
                # print() writes to the rank's log (worker_logs) once, not also through Ray
                # Train's logger, which tees it when stdout is redirected.
                "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
                # The bucket's endpoint, when the service was given one (never credentials).
                **{key: os.environ[key] for key in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
                   if os.environ.get(key)},
            }},
        ),
    )
