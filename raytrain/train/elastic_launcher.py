"""Run an elastic job's replica groups on Ray Train: one `TorchTrainer.fit()` per group, all
joined by one torchft Lighthouse in the job's runner, so that a group lost with its node is
replaced while the others train on.

Why not Ray Train's own `TorchftConfig`: it replaces a failed replica group inside one fit,
but only for groups of one worker, at a fixed size, with the preemption watcher off; and it
knows nothing of our notices. A fit per group lets a group hold any layout of its own (FSDP,
tensor parallel), lets a noticed group leave at a step boundary and be bought again at once,
and keeps the job manager's record of each group. Each group's fit is the rigid job's fit
with the group's share of the workers; the loop is raytrain.train.loop's, among the groups of
raytrain.train.replica_group.

The runner reports the run's start once (the groups share its attempt); each group's rank 0
reports its own notice ("leaving") and its start as a replacement ("healing"); the group
leading the quorum reports progress, checkpoints, the groups it sees leave and join, and the
end.

    run_elastic_job(spec, layout, groups=4, job_id=..., checkpoint_root=..., run_root=...,
                    manager=("raytrain", "raytrain-job-manager"), worker_resources={...})
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import ray
import ray.train
import torch

from raytrain.cloud.interruption import Watcher
from raytrain.errors import TrainingError
from raytrain.spec import JobSpec, Layout
from raytrain.train.launcher import ManagerSink, build_trainer, node_endpoint, watching
from raytrain.train.loop import train
from raytrain.train.progress import NullSink, ProgressSink
from raytrain.train.rank import WorkerInfo
from raytrain.train.replica_group import HEAL_FAILED, GroupEvents, GroupSetup, ReplicaGroup
from raytrain.train.worker_logs import stored_output

logger = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT_MS = 3000  # a group silent this long is out of the quorum (a lost node)
FINISH_GRACE_S = 30.0  # once the job is done, how long the other groups have to end
POLL_S = 5.0
LEAVING_REPORT_TIMEOUT_S = 10.0  # of the notice's ~120 s: the group leaves regardless
REPLACEMENT_WAIT_S = 3600.0


class ManagerEvents(GroupEvents):
    def __init__(self, manager: Any, job_id: str, attempt: int) -> None:
        self.manager, self.job_id, self.attempt = manager, job_id, attempt

    def report(self, group: int, state: str, step: int, redone_steps: int = 0,
               stall_s: float | None = None) -> None:
        self.manager.report_group.remote(self.job_id, self.attempt, group, state, None, step,
                                         False, redone_steps, stall_s)


def elastic_group_fn(config: dict[str, Any]) -> None:
    """Ray Train's per-worker entry point for one replica group."""
    torch.set_num_threads(config["threads_per_worker"])
    context = ray.train.get_context()
    spec: JobSpec = config["spec"]  # validated once, where the job came in
    layout: Layout = config["layout"]
    group = config["group"]
    worker = WorkerInfo(rank=context.get_world_rank(), world_size=context.get_world_size(),
                        device=ray.train.torch.get_device())
    namespace, name = config["manager"]
    manager = ray.get_actor(name, namespace=namespace)
    attempt = config["attempt"]
    sink: ProgressSink = NullSink()
    events: GroupEvents = GroupEvents()
    if worker.rank == 0:
        sink = ManagerSink(manager, config["job_id"], {}, attempt=attempt)
        events = ManagerEvents(manager, config["job_id"], attempt)
        node = ray.get_runtime_context().get_node_id()  # where the group runs (or heals)
        manager.report_group.remote(config["job_id"], attempt, group,
                                    "healing" if config["replacement"] else "training", [node])
    setup = GroupSetup(config["lighthouse"], os.environ["MASTER_ADDR"],
                       int(os.environ["MASTER_PORT"]), f"{config['job_id']}-g",
                       config["groups"], beats=config["beats"])
    endpoint = node_endpoint(config.get("interruption_endpoint"))
    header = (f"job {config['job_id']}, replica group {group}, rank {worker.rank} of "
              f"{worker.world_size}, node {ray.get_runtime_context().get_node_id()[:12]}")
    with stored_output(config["log_dir"], group * worker.world_size + worker.rank, header), \
            watching(endpoint) as watcher:
        notices = _Reporting(watcher, manager, config["job_id"], attempt, group) \
            if watcher is not None and worker.rank == 0 else watcher
        result = train(spec, worker, sink, config["checkpoint_root"], layout=layout,
                       notices=notices, members=ReplicaGroup(setup, group, worker, events,
                                                             heals=config["replacement"]))
    logger.info("replica group %d ended at step %d%s", group, result["steps"],
                " (it left)" if result["left"] else "")


class _Reporting:
    """A node's notices, told to the service once as the group's "leaving" (so its
    replacement is bought now)."""

    def __init__(self, watcher: Watcher, manager: Any, job_id: str, attempt: int,
                 group: int) -> None:
        self.watcher, self.manager = watcher, manager
        self.job_id, self.attempt, self.group = job_id, attempt, group
        self.told = False

    @property
    def stop_requested(self) -> bool:
        asked = self.watcher.stop_requested
        if asked and not self.told:
            self.told = True
            # Told before the group leaves the quorum, so that the service hears "leaving"
            # before a survivor can report the group gone (a lost node, without notice).
            try:
                ray.get(self.manager.report_group.remote(self.job_id, self.attempt,
                                                         self.group, "leaving"),
                        timeout=LEAVING_REPORT_TIMEOUT_S)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
                logger.warning("the service did not take this group's notice in time; it "
                               "leaves all the same")
        return asked

    @property
    def noticed_at(self) -> float | None:
        return self.watcher.noticed_at

    def take_checkpoint_request(self) -> bool:
        return self.watcher.take_checkpoint_request()


def run_elastic_job(spec: JobSpec, layout: Layout, groups: int, job_id: str,
                    checkpoint_root: str, run_root: Path, manager_name: tuple[str, str],
                    worker_resources: dict[str, float] | None = None,
                    interruption_endpoint: str | None = None) -> None:
    """Run the job's `groups` replica groups until one finishes the job (or the service
    stops them); a group that leaves or dies is started again (its fit waits for a node).
    Raises when every group is lost: the job manager then resumes the job from its
    checkpoint; and when a group cannot load a live group's state (HealFailed: a defect, which
    a replacement would meet again), so that the job says so rather than train on with fewer
    groups than planned."""
    from torch.distributed import TCPStore
    from torchft.coordination import LighthouseServer

    os.makedirs(run_root, exist_ok=True)
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    os.environ.setdefault("RUST_LOG", "error")
    # A replacement group's fit starts before its node exists (its placement group is the
    # demand that buys one): let it wait for the node as long as capacity may take.
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", str(REPLACEMENT_WAIT_S))
    namespace, name = manager_name
    manager = ray.get_actor(name, namespace=namespace)
    attempt = ray.get(manager.worker_group_started.remote(job_id, _committed(checkpoint_root),
                                                          {"nodes": groups}))
    if attempt < 0:
        return  # cancelled while starting
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=500,
                                  heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    # Where every rank beats (raytrain.train.heartbeats), beside the Lighthouse: its host is
    # the name the groups already reach the Lighthouse by.
    beat_store = TCPStore(urlparse(lighthouse.address()).hostname or "localhost", 0,
                          is_master=True, wait_for_workers=False)
    beats = f"{urlparse(lighthouse.address()).hostname}:{beat_store.port}"
    per_group = spec.resources.num_workers // groups
    group_spec = spec.model_copy(update={"resources": spec.resources.model_copy(
        update={"num_workers": per_group})})
    inner = replace(layout, dp_replicate=1)

    fitting: set[str] = set()  # Ray Train run ids of the fits not yet returned

    def fit(group: int, replacement: bool, avoid: list[str]) -> Any:
        trainer = build_trainer(
            group_spec, inner, job_id, checkpoint_root, run_root, manager_name,
            worker_resources, interruption_endpoint, train_fn=elastic_group_fn,
            extra_config={"group": group, "groups": groups, "attempt": attempt,
                          "lighthouse": lighthouse.address(), "replacement": replacement,
                          "beats": beats},
            name=f"job-{job_id}-g{group}-{time.monotonic_ns()}", avoid_nodes=avoid)
        run_id = trainer.train_run_context.run_id
        fitting.add(run_id)
        try:
            return trainer.fit()
        finally:
            fitting.discard(run_id)

    pool = ThreadPoolExecutor(max_workers=2 * groups + 2)
    running: dict[Future, int] = {pool.submit(fit, g, False, []): g for g in range(groups)}
    finished_at: float | None = None
    stopped = False
    try:
        while running:
            timeout = POLL_S if finished_at is None else \
                max(0.0, FINISH_GRACE_S - (time.monotonic() - finished_at))
            done, _ = wait(running, timeout=timeout, return_when=FIRST_COMPLETED)
            if not done and finished_at is not None:
                break  # the job is done; groups still waiting for a node are not needed
            for future in done:
                group = running.pop(future)
                error: BaseException | None = None
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 - its node was lost (or it failed)
                    logger.warning("job %s: replica group %d ended: %s", job_id, group, exc)
                    error = exc
                    if HEAL_FAILED in str(exc):  # a defect: a replacement would fail alike
                        raise TrainingError(f"job {job_id}: replica group {group} "
                                            f"{HEAL_FAILED}: {exc}") from None
                view = _after_its_end(manager, job_id, attempt, group)
                if view["step"] >= spec.training.steps:
                    finished_at = finished_at or time.monotonic()
                elif view["stopping"]:
                    stopped = True  # the service's stop or move: every group leaves
                elif finished_at is None and not stopped:
                    if not _live(view["groups"], running):
                        # No group left to heal from: the job goes back to its checkpoint
                        # (the last group saved one if it left on a notice).
                        if error is not None:
                            raise error
                        return
                    # A replacement, never on a node a group left on its notice: that node
                    # is going (until the cloud takes it, its CPUs look free).
                    running[pool.submit(fit, group, True, view["avoid"])] = group
    finally:
        lighthouse.shutdown()
        pool.shutdown(wait=False, cancel_futures=True)
        _cancel_node_requests(set(fitting))
        del beat_store


def _cancel_node_requests(run_ids: set[str]) -> None:
    """Withdraw the node requests of fits left starting when the run ends (a replacement
    still waiting for its node): each Ray Train controller registers its worker group's
    resources with Ray's autoscaling coordinator as `train-<run id>` and withdraws them only
    when its run ends, so a controller that goes with this runner left its request standing
    until it expired (180 s), and the autoscaler kept a node bought for it."""
    if not run_ids:
        return
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    coordinator = get_or_create_autoscaling_coordinator()
    for run_id in run_ids:
        coordinator.cancel_request.remote(f"train-{run_id}")
    logger.info("withdrew the node requests of %d replica group(s) still starting",
                len(run_ids))


def _after_its_end(manager: Any, job_id: str, attempt: int, group: int) -> dict[str, Any]:
    """The run's view once `group`'s fit has ended. A group still "leaving" then left on its
    notice and no survivor saw it go: none shared a quorum with it yet (the others were still
    starting, and resume from the checkpoint it saved). Its preemption is recorded here."""
    view: dict[str, Any] = ray.get(manager.run_view.remote(job_id))
    if view["groups"].get(group) == "leaving":
        ray.get(manager.report_group.remote(job_id, attempt, group, "gone", None, view["step"],
                                            True))
        view["groups"][group] = "gone"
    return view


def _live(states: dict[int, str], running: dict[Future, int]) -> set[int]:
    """Groups whose fit runs and that train (or heal, or leave): not replacements still
    waiting for a node."""
    return {g for g in running.values() if states.get(g) in ("training", "leaving", "healing")}


def _committed(checkpoint_root: str) -> int:
    from raytrain.cloud.object_store import open_store
    from raytrain.train.checkpoint import committed_steps

    steps = committed_steps(open_store(checkpoint_root))
    return steps[-1] if steps else 0
