"""One-pod jobs on RunPod's interruptible pods, which cannot join the Ray cluster: the pods
bought for them (`PodFleet`) and each run on one, driven over the pod's public SSH (`PodRun`).

RunPod rents interruptible pods only through its GraphQL API, whose create takes no global
networking (raytrain.cloud.runpod), so such a pod never reaches the head's private network.
A job that fits one pod (1 to 8 GPUs on one host, what most RTX 4090 users rent) still runs
there: the service rents the pod, waits for RunPod to publish its SSH (v2's `ssh.direct`),
and runs `python -m raytrain.train.pod_main` on it over `ssh` with the service's key, as
`ray up` reaches a head and as SkyPilot and dstack drive GPU clouds. The pod trains with the
same loop as every job (raytrain.train.pod_main), checkpoints to the job's storage (a bucket,
or a folder the pod mounts), and its reports and the service's answers travel as JSON lines
over the session. A pod RunPod takes back ends the session (ssh's keep-alive notices a
silent loss within about 6 s): the run ends with an error while its pod is gone from the
listing, which the job manager takes as a preemption without notice, and it resumes from the
last committed checkpoint on whatever capacity the policy picks next.

Written by hand because no library drives a training process over SSH with a channel back;
the SSH itself is the system's `ssh` client (as Ray's updater uses), with keep-alives.

    fleet = PodFleet(api, {"rtx4090x1-spot": pod_type}, ssh_key=Path("~/.ssh/raytrain"))
    fleet.request("job1", "rtx4090x1-spot", 1); fleet.alive()       # pods as nodes
    run = fleet.launch(reports, "job1", "rtx4090x1-spot", spec, layout, root, logs)
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from raytrain.cloud.runpod import (
    InterruptibleRequest,
    NoCapacity,
    RunPodAPI,
    RunPodError,
    pod_env,
    pod_ssh,
)
from raytrain.spec import JobSpec, Layout
from raytrain.spec.service import PodType
from raytrain.train.pod_main import LINE_PREFIX

logger = logging.getLogger(__name__)

JOB_ENV = "RAYTRAIN_POD_JOB"  # the job a pod was rented for, in its environment
STORAGE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
LIST_EVERY_S = 5.0  # the fleet's view of RunPod's pods is at most this old
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
               "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
               "-o", "ConnectTimeout=15",
               # A pod lost with no socket closed (its host gone) is noticed within 6 s.
               "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3")


class Reports(Protocol):
    """What a run tells the job manager (raytrain.serve.jobs.manager.JobManager), as rank 0's
    sink does on Ray."""

    def worker_group_started(self, job_id: str, resumed_step: int,
                             placement: dict[str, Any]) -> int: ...

    def report_progress(self, job_id: str, attempt: int,
                        payload: dict[str, Any]) -> dict[str, Any]: ...

    def report_checkpoint(self, job_id: str, attempt: int, step: int, path: str,
                          save_s: float | None = None,
                          durable_s: float | None = None) -> None: ...

    def report_finished(self, job_id: str, attempt: int, result: dict[str, Any]) -> None: ...


class PodRun:
    """One job's run on one pod, over an `ssh` session: starts at once, ends when the
    session does. `outcome` is None when the run finished and the pod's process exited 0."""

    def __init__(self, reports: Reports, job_id: str, pod_id: str, address: tuple[str, int],
                 ssh_key: Path, command: str, config: dict[str, Any],
                 placement: dict[str, Any]) -> None:
        self.reports, self.job_id, self.pod_id = reports, job_id, pod_id
        self.placement = placement
        host, port = address
        self.process = subprocess.Popen(
            ["ssh", "-i", str(ssh_key), "-p", str(port), *SSH_OPTIONS, f"root@{host}",
             command], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        self.done = threading.Event()
        self.error: str | None = None
        self._finished = False
        self._attempt = 0
        self._tail: deque[str] = deque(maxlen=20)  # output that is not ours: a failed start
        self._send(config)
        threading.Thread(target=self._read, name=f"pod-run-{job_id}", daemon=True).start()

    def _send(self, message: dict[str, Any]) -> None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the session ended: the reader says how

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            for line in self.process.stdout:
                if line.startswith(LINE_PREFIX):
                    self._take(json.loads(line[len(LINE_PREFIX):]))
                elif line.strip():
                    self._tail.append(line.rstrip()[:300])
        except Exception as exc:  # a report the manager refused: the run cannot go on
            logger.exception("job %s: the run on pod %s failed to report", self.job_id,
                             self.pod_id)
            self.error = f"the service could not take the pod's report: {exc}"
            self.stop()
        code = self.process.wait()
        if self.error is None and not (self._finished and code == 0):
            said = "; ".join(list(self._tail)[-3:])
            if code == 255:  # ssh's own failure: the connection, not the command
                self.error = (f"the SSH connection to pod {self.pod_id} closed before the "
                              "run finished: the pod was taken back, or its runner could not "
                              "start" + (f" ({said})" if said else ""))
            else:
                self.error = (f"the pod runner on pod {self.pod_id} exited {code} over SSH "
                              f"before the run finished: {said or 'it said nothing'}. To fix: "
                              "check that the pod type's command installs raytrain and runs "
                              "python3 -m raytrain.train.pod_main")
        self.done.set()

    def _take(self, message: dict[str, Any]) -> None:
        kind = message.get("kind")
        if kind == "started":
            self._attempt = self.reports.worker_group_started(
                self.job_id, int(message.get("step", 0)), self.placement)
            self._send({"kind": "started", "attempt": self._attempt})
        elif kind == "progress":
            reply = self.reports.report_progress(self.job_id, self._attempt,
                                                 dict(message.get("payload") or {}))
            self._send({"kind": "reply", **reply})
        elif kind == "checkpoint":
            self.reports.report_checkpoint(self.job_id, self._attempt, int(message["step"]),
                                           str(message["path"]), message.get("save_s"),
                                           message.get("durable_s"))
        elif kind == "finished":
            self.reports.report_finished(self.job_id, self._attempt,
                                         dict(message.get("result") or {}))
            self._finished = True
        elif kind == "failed":
            self.error = str(message.get("error"))

    def stop(self) -> None:
        """End the session (the pod's ranks stop when its input ends)."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass
        if self.process.poll() is None:
            self.process.terminate()


@dataclass
class _Rented:
    job_id: str
    node_type: str
    run: PodRun | None = None


@dataclass
class PodFleet:
    """The interruptible pods the service rented, by job, and the runs on them.

    What the job manager asks (`request`, `withdraw`, `alive`, `launch`) answers from memory
    at once: it is asked with the manager's lock held, and RunPod may take seconds. A keeper
    thread does the calls: every `list_every_s` (and at once when asked) it lists RunPod's
    pods (a pod taken back drops out), rents the pods jobs want and lacks, and terminates
    those no job wants that no live run is on, so none is left running unaccounted."""

    api: RunPodAPI
    types: dict[str, PodType]
    ssh_key: Path
    public_key: str
    name_prefix: str = "raytrain-pod"
    list_every_s: float = LIST_EVERY_S
    _rented: dict[str, _Rented] = field(default_factory=dict)
    _wanted: dict[str, tuple[str, int]] = field(default_factory=dict)  # job -> (type, pods)
    _listing: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _wake: threading.Event = field(default_factory=threading.Event)
    _keeper: threading.Thread | None = None
    _closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        """Stop the keeper (the pods stay: their jobs' releases or `reclaim` end them)."""
        self._closed.set()
        self._wake.set()

    def _start(self) -> None:
        with self._lock:
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep_forever, name="pod-fleet",
                                                daemon=True)
                self._keeper.start()

    def request(self, job_id: str, node_type: str, count: int) -> None:
        """The job wants `count` pods of `node_type`: rented by the keeper, at once."""
        with self._lock:
            self._wanted[job_id] = (node_type, count)
        self._start()
        self._wake.set()

    def withdraw(self, job_id: str) -> None:
        with self._lock:
            if job_id not in self._wanted and not any(r.job_id == job_id
                                                      for r in self._rented.values()):
                return
            kind = self._wanted.get(job_id, ("", 0))[0]
            self._wanted[job_id] = (kind, 0)
        self._start()
        self._wake.set()

    def _keep_forever(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.list_every_s)
            self._wake.clear()
            if self._closed.is_set():
                return
            try:
                self.keep()
            except Exception:  # one bad round must not end the keeping
                logger.exception("keeping RunPod's pods failed; trying again")

    def keep(self) -> None:
        """One round: list, rent what is wanted and missing, end what is not wanted."""
        try:
            listed = {p["id"]: p for p in self.api.pods()}
        except RunPodError as exc:
            logger.warning("cannot list RunPod's pods (%s); the last listing stands", exc)
            listed = None
        with self._lock:
            if listed is not None:
                for pod_id in [p for p in self._rented if p not in listed]:
                    logger.warning("interruptible pod %s is gone (taken back)", pod_id)
                    self._rented.pop(pod_id)
                self._listing = {p: listed[p] for p in self._rented}
            wanted = dict(self._wanted)
        for job_id, (node_type, count) in wanted.items():
            with self._lock:
                have = sum(1 for r in self._rented.values() if r.job_id == job_id)
            for _ in range(count - have):
                try:
                    self._rent(job_id, node_type, self.types[node_type])
                except RunPodError as exc:
                    logger.warning("job %s: no interruptible pod of %s now: %s", job_id,
                                   node_type, exc)
                    break
            self._end_unwanted(job_id)
            with self._lock:
                if count == 0 and not any(r.job_id == job_id for r in self._rented.values()):
                    self._wanted.pop(job_id, None)

    def _rent(self, job_id: str, node_type: str, pod_type: PodType) -> None:
        price = self.api.spot_prices(pod_type.gpu_count).get(pod_type.gpu_type_id)
        if price is None:
            raise NoCapacity(f"RunPod lists no interruptible {pod_type.gpu_type_id} now")
        if pod_type.bid_per_gpu is not None and price > pod_type.bid_per_gpu:
            raise NoCapacity(f"RunPod's interruptible {pod_type.gpu_type_id} costs "
                             f"${price:.3f} per GPU-hour, above the ceiling "
                             f"${pod_type.bid_per_gpu:.3f}")
        name = f"{self.name_prefix}-{node_type}-{uuid.uuid4().hex[:8]}"
        pod = self.api.rent_interruptible(InterruptibleRequest(
            name=name, image=pod_type.image, gpu_type_id=pod_type.gpu_type_id,
            gpu_count=pod_type.gpu_count, bid_per_gpu=price, disk_gb=pod_type.disk_gb,
            env={"PUBLIC_KEY": self.public_key, JOB_ENV: job_id}))
        with self._lock:
            self._rented[pod["id"]] = _Rented(job_id, node_type)
        logger.info("job %s: interruptible pod %s rented (%s, $%.3f per GPU-hour)", job_id,
                    pod["id"], node_type, price)
        self._wake.set()  # list again soon: its SSH is published once it runs

    def _end_unwanted(self, job_id: str) -> None:
        """Terminate the job's pods beyond what it wants that no live run is on."""
        with self._lock:
            wanted = self._wanted.get(job_id, ("", 0))[1]
            mine = [(p, r) for p, r in self._rented.items() if r.job_id == job_id]
            busy = [p for p, r in mine if r.run is not None and not r.run.done.is_set()]
            idle = [p for p, r in mine if p not in busy]
            extra = idle[:max(0, len(mine) - max(wanted, len(busy)))]
        for pod_id in extra:
            self._terminate(pod_id)

    def _terminate(self, pod_id: str) -> None:
        try:
            self.api.terminate(pod_id)
        except RunPodError as exc:
            logger.warning("pod %s is not terminated yet (%s); the next round tries again",
                           pod_id, exc)
            return
        with self._lock:
            self._rented.pop(pod_id, None)
            self._listing.pop(pod_id, None)
        logger.info("interruptible pod %s terminated", pod_id)

    def alive(self) -> dict[str, dict[str, Any]]:
        """The rented pods that are RUNNING with their SSH published, by id, as the keeper
        last listed them (a pod taken back drops out at its next round)."""
        with self._lock:
            return {p: pod for p, pod in self._listing.items() if p in self._rented
                    and pod.get("status") == "RUNNING" and pod_ssh(pod) is not None}

    def nodes(self) -> dict[str, dict[str, float]]:
        """The alive pods as the job manager counts nodes: each with its node type's
        resource, its GPUs and CPUs (in one look, whatever the keeper does meanwhile)."""
        with self._lock:
            return {pod_id: {rented.node_type: 1.0,
                             "GPU": float(self.types[rented.node_type].gpu_count),
                             "CPU": self.types[rented.node_type].cpus}
                    for pod_id in self.alive() if (rented := self._rented.get(pod_id))}

    def launch(self, reports: Reports, job_id: str, node_type: str, spec: JobSpec,
               layout: Layout, checkpoint_root: str, log_uri: str) -> PodRun:
        """Start the job's run on its pod of `node_type` (one that is alive and free)."""
        alive = self.alive()
        with self._lock:
            free = [p for p, r in self._rented.items() if r.job_id == job_id
                    and r.node_type == node_type and p in alive
                    and (r.run is None or r.run.done.is_set())]
        if not free:
            raise RunPodError(f"job {job_id} has no running pod of {node_type} to start on")
        pod_id = free[0]
        address = pod_ssh(alive[pod_id])
        assert address is not None
        pod_type = self.types[node_type]
        # The job's storage for the pod: its bucket's endpoint and the service's credentials,
        # over the session's input (never in a command line, an environment RunPod shows,
        # or a log).
        storage = {key: os.environ[key] for key in STORAGE_ENV if os.environ.get(key)}
        config = {"job_id": job_id, "env": storage, "spec": spec.model_dump(mode="json"),
                  "layout": asdict(layout), "checkpoint_root": checkpoint_root,
                  "log_uri": log_uri, "threads": max(1, int(spec.resources.cpus_per_worker))}
        run = PodRun(reports, job_id, pod_id, address, self.ssh_key, pod_type.command, config,
                     {"placement_group": None, "accelerator": pod_type.gpu_type_id,
                      "nodes": 1, "pod": pod_id})
        with self._lock:
            self._rented[pod_id].run = run
        threading.Thread(target=self._after, args=(run,), daemon=True).start()
        return run

    def _after(self, run: PodRun) -> None:
        """Once a run ends, the keeper looks at once (its pod goes unless its job still wants
        it; a pod taken back drops out of the listing)."""
        run.done.wait()
        self._wake.set()

    def reclaim(self) -> None:
        """Terminate pods this service rented (by name) that its books do not hold: a lost
        job manager's, whose jobs resume from their checkpoints."""
        try:
            pods = self.api.pods()
        except RunPodError as exc:
            logger.warning("cannot look for a lost manager's pods (%s)", exc)
            return
        with self._lock:
            known = set(self._rented)
        for pod in pods:
            if str(pod.get("name", "")).startswith(f"{self.name_prefix}-") and \
                    pod["id"] not in known and JOB_ENV in pod_env(pod):
                logger.warning("pod %s of job %s was left by a lost job manager", pod["id"],
                               pod_env(pod)[JOB_ENV])
                self._terminate(pod["id"])

